"""MkDocs hooks (mkdocs.yml ``hooks:``): the reference pages generated from the code, and the benchmark reports.

- ``<!-- globald:config-reference -->`` in a page becomes the configuration reference, rendered from the key
  declarations themselves (``globald.settings.spec.declared_keys`` over ``globald.settings.config.Config``): the
  same source that validates a config and that ``globald check-config --keys`` prints, so the page cannot drift
  from either. The librdkafka properties globald manages, and the defaults it gives the consumer, come from
  ``globald.settings.kafka_properties``.
- ``<!-- globald:cli-reference -->`` becomes the CLI reference, rendered from the argparse parser
  (``globald.cli.main.build_parser``): each subcommand's usage line and arguments.
- ``<!-- globald:module-map -->`` becomes the map of the ``globald`` package: each package and module with the
  first paragraph of its docstring, read from the source (nothing imported), so the map follows every move.
- ``<!-- globald:readme -->`` becomes the README (the front door), its ``docs/`` links made relative to the site,
  so the home page and the README are one text.
- ``<!-- globald:import-contracts -->`` becomes the list of import-linter contracts in ``pyproject.toml``, the
  boundaries ``make lint`` holds the code to.
- ``<!-- globald:api MODULE.NAME -->`` becomes the reference of one public class or function: its signature and
  docstring, and for a class those of its public methods, read from the code itself.
- ``<!-- globald:file PATH -->`` becomes that file of the repository as a code block (the example config).
- ``bench/results/bench-*.{md,png}`` (the last ``make bench`` reports) are served under ``benchmarks/results/``.

Nothing here is written to docs/: the generated text exists only in the built site.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import os
import re
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parent.parent
CONFIG_MARK = "<!-- globald:config-reference -->"
CLI_MARK = "<!-- globald:cli-reference -->"
MODULES_MARK = "<!-- globald:module-map -->"
README_MARK = "<!-- globald:readme -->"
CONTRACTS_MARK = "<!-- globald:import-contracts -->"
API_MARK = re.compile(r"<!-- globald:api ([\w.]+) -->")
FILE_MARK = re.compile(r"^([ \t]*)<!-- globald:file ([\w./-]+) -->", re.M)  # indented: inside an admonition
BENCH_RESULTS = ("bench-1M.md", "bench-1M.png", "bench-10M.md", "bench-10M.png")

if str(REPO) not in sys.path:  # the docs describe this checkout, not whatever globald is installed
    sys.path.insert(0, str(REPO))


def _module(*names: str) -> ModuleType:
    """The first of ``names`` that imports (modules may move between packages; the reference must not break)."""
    errors = []
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError as e:
            errors.append(f"{name}: {e}")
    raise ImportError("docs/hooks.py cannot find " + " or ".join(names) + ": " + "; ".join(errors))


def _attr(attr: str, *names: str) -> Any:
    errors = []
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            errors.append(f"{name}: {type(e).__name__}: {e}")
            continue
        if hasattr(module, attr):
            return getattr(module, attr)
        errors.append(f"{name}: has no {attr}")
    raise ImportError(f"docs/hooks.py cannot find {attr}: " + "; ".join(errors))


# -- configuration reference ------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    """``text`` as one cell of a Markdown table: no line break, ``|`` escaped, and ``<...>`` outside code spans
    shown as written rather than taken for an HTML tag."""
    parts = re.split(r"(`+[^`]*`+)", text.replace("\n", " "))
    return "".join(p if p.startswith("`") else p.replace("<", "&lt;").replace(">", "&gt;")
                   for p in parts).replace("|", "\\|")


def _section_of(path: str) -> str:
    return path.split(".", 1)[0].split("[", 1)[0] if ("." in path) else ""


def config_reference() -> str:
    spec = _module("globald.settings.spec")
    config_cls = _attr("Config", "globald.settings.config")
    keys = spec.declared_keys(config_cls)
    sections: dict[str, list[Any]] = {}
    heads: dict[str, Any] = {}
    for k in keys:
        section = _section_of(k.path)
        if section == "" and k.spec.nested() is not None:
            heads[k.path] = k  # a section's own entry: its help heads the section
            sections.setdefault(k.path, [])
            continue
        sections.setdefault(section, []).append(k)
    out: list[str] = []
    for section, members in sections.items():
        if section == "":
            out += ["## Top-level keys", ""]
        else:
            head = heads[section]
            toml = f"[[{section}]]" if head.spec.nested()[0].startswith("[]") else f"[{section}]"
            required = " Required." if head.required else ""
            out += [f"## `{toml}`", "", f"{head.spec.help[0].upper()}{head.spec.help[1:]}.{required}", ""]
        if not members:
            continue
        out += ["| key | type and bounds | default | what it does |", "|---|---|---|---|"]
        for k in members:
            anchor = k.path.replace("[]", "")
            out.append(f'| <span id="{anchor}"></span>`{k.path}` | {_cell(k.spec.kind())} | '
                       f"{_cell(k.default_text() or '—')} | {_cell(k.spec.help)} |")
        out.append("")
    out += _kafka_properties()
    return "\n".join(out)


def _kafka_properties() -> list[str]:
    props = _module("globald.settings.kafka_properties")
    out = ["## `[kafka]` properties globald sets", "",
           "Every `[kafka]` entry is a librdkafka property, passed to every client globald makes. These are "
           "managed: globald always sets them, and a config giving another value is refused (exit 2):", "",
           "| property | value |", "|---|---|"]
    out += [f"| `{k}` | `{json.dumps(v)}` |" for k, v in props.MANAGED_KAFKA_PROPERTIES.items()]
    defaults = getattr(props, "CONSUMER_DEFAULTS", {})
    if defaults:
        out += ["", "These the daemon's consumer gets unless `[kafka]` sets them:", "",
                "| property | default |", "|---|---|"]
        out += [f"| `{k}` | `{json.dumps(v)}` |" for k, v in defaults.items()]
    return [*out, ""]


# -- CLI reference ----------------------------------------------------------------------------------------------


def _argument(a: argparse.Action) -> tuple[str, str, str, str]:
    name = ", ".join(f"`{o}`" for o in a.option_strings) if a.option_strings else f"`{a.metavar or a.dest}`"
    if a.option_strings and a.nargs != 0:
        name += f" `{a.metavar or a.dest.upper()}`"
    required = "yes" if (a.required or not a.option_strings) else ""
    default = ""
    if a.choices:
        default = "one of " + ", ".join(f"`{c}`" for c in a.choices)
    if a.default not in (None, False, argparse.SUPPRESS) and a.nargs != 0:
        default = (default + "; " if default else "") + f"default `{a.default}`"
    return name, required, default, a.help or ""


def cli_reference() -> str:
    build_parser = _attr("build_parser", "globald.cli.main")
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "112"  # argparse wraps usage lines at the terminal's width: make the page reproducible
    try:
        parser = build_parser()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        helps = {c.dest: c.help for c in sub._choices_actions}
        out = ["```text", parser.format_usage().strip(), "```", ""]
        top = [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
        if top:
            out += ["| option | what it does |", "|---|---|"]
            out += [f"| {_argument(a)[0]} | {_cell(a.help or '')} |" for a in top]
            out.append("")
        out += ["| command | what it does |", "|---|---|"]
        out += [f"| [`globald {name}`](#globald-{name}) | {_cell(helps.get(name) or '')} |" for name in sub.choices]
        out.append("")
        for name, sp in sub.choices.items():
            out += [f"## `globald {name}` {{ #globald-{name} }}", "", sp.description or helps.get(name) or "", "",
                    "```text", sp.format_usage().strip(), "```", ""]
            args = [a for a in sp._actions if not isinstance(a, argparse._HelpAction)]
            if args:
                out += ["| argument | required | values | what it does |", "|---|---|---|---|"]
                out += ["| " + " | ".join(_cell(c) for c in _argument(a)) + " |" for a in args]
                out.append("")
        return "\n".join(out)
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous


# -- module map -------------------------------------------------------------------------------------------------


def _summary(path: Path) -> str:
    try:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return ""
    return " ".join((doc or "").split("\n\n", 1)[0].split())


def module_map(root: Path | None = None) -> str:
    root = root or REPO / "globald"
    out: list[str] = []
    packages = sorted([root, *(d for d in root.rglob("*") if d.is_dir() and any(d.glob("*.py"))
                               and "__pycache__" not in d.parts)])
    for pkg in packages:
        rel = pkg.relative_to(root.parent).as_posix()
        out += [f"### `{rel}/`", ""]
        about = _summary(pkg / "__init__.py")
        if about:
            out += [about, ""]
        modules = sorted(f for f in pkg.glob("*.py") if f.name not in ("__init__.py", "__main__.py"))
        if modules:
            out += ["| module | what it is |", "|---|---|"]
            out += [f"| `{m.name}` | {_cell(_summary(m)) or '—'} |" for m in modules]
            out.append("")
    return "\n".join(out)


# -- import contracts -------------------------------------------------------------------------------------------


def import_contracts() -> str:
    with open(REPO / "pyproject.toml", "rb") as f:
        contracts = tomllib.load(f).get("tool", {}).get("importlinter", {}).get("contracts", [])
    return "\n".join(f"- {c['name']} (`{c.get('type', '?')}`)" for c in contracts) + "\n"


# -- Python API -------------------------------------------------------------------------------------------------


def _signature(obj: Any, name: str) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return f"{name}(...)"
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values() if p.name != "self"]
    plain = sig.replace(parameters=params, return_annotation=inspect.Signature.empty)
    return f"{name}{plain}"


def _doc(obj: Any) -> list[str]:
    doc = inspect.getdoc(obj)
    return [doc, ""] if doc else []


def api_reference(path: str) -> str:
    module_name, _, name = path.rpartition(".")
    obj = getattr(importlib.import_module(module_name), name)
    if not inspect.isclass(obj):
        return "\n".join([f"### `{_signature(obj, name)}`", "", *_doc(obj)])
    out = [f"### `{_signature(obj, name)}`", "", *_doc(obj)]
    for attr, member in inspect.getmembers(obj):
        if attr.startswith("_"):
            continue
        if isinstance(inspect.getattr_static(obj, attr), property):
            out += [f"#### `{name}.{attr}` (property)", "", *_doc(member)]
        elif inspect.isfunction(member):
            out += [f"#### `{name}.{_signature(member, attr)}`", "", *_doc(member)]
    return "\n".join(out)


def repo_file(path: str) -> str:
    text = (REPO / path).read_text(encoding="utf-8").rstrip("\n")
    language = {".toml": "toml", ".yml": "yaml", ".yaml": "yaml", ".py": "python"}.get(Path(path).suffix, "text")
    return f'```{language} title="{path}"\n{text}\n```'


# -- mkdocs events ----------------------------------------------------------------------------------------------


def on_files(files: Files, config: Any) -> Files:
    for name in BENCH_RESULTS:
        source = REPO / "bench" / "results" / name
        if source.is_file():
            files.append(File.generated(config, f"benchmarks/results/{name}", abs_src_path=str(source)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if CONFIG_MARK in markdown:
        markdown = markdown.replace(CONFIG_MARK, config_reference())
    if CLI_MARK in markdown:
        markdown = markdown.replace(CLI_MARK, cli_reference())
    if README_MARK in markdown:
        markdown = markdown.replace(README_MARK, (REPO / "README.md").read_text(encoding="utf-8")
                                    .replace("](docs/", "]("))
    markdown = API_MARK.sub(lambda m: api_reference(m.group(1)), markdown)
    markdown = FILE_MARK.sub(lambda m: "\n".join(m.group(1) + line if line else line
                                                  for line in repo_file(m.group(2)).split("\n")), markdown)
    if CONTRACTS_MARK in markdown:
        markdown = markdown.replace(CONTRACTS_MARK, import_contracts())
    if MODULES_MARK in markdown:
        markdown = markdown.replace(MODULES_MARK, module_map())
    return markdown
