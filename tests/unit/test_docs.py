"""The documentation site (``docs/``, ``mkdocs.yml``): what ``make docs`` cannot check by building it.

``make test`` builds the site strictly (broken links and anchors fail it); these tests hold the rest: the README
stays a front door that gives the two commands, the generated reference pages list every config key, command and
module, and the sections other files cite by name are still there to be found.
"""

from __future__ import annotations

import importlib.util
import re
from types import ModuleType

from tests.harness import REPO

DOCS = REPO / "docs"


def hooks() -> ModuleType:
    from tests.ci import require_module  # here, not at the top: only the hooks need the [docs] extra

    require_module("mkdocs", "docs")
    spec = importlib.util.spec_from_file_location("globald_docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def headings() -> set[str]:
    found = set()
    for page in DOCS.rglob("*.md"):
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)  # a `# ` line in code is no heading
        found |= {h.strip() for h in re.findall(r"^#{1,4} (.+)$", text, flags=re.M)}
    return found


def test_the_readme_is_a_front_door_with_the_two_commands() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250, "the README is a front door: the rest belongs in docs/"
    assert re.search(r"^make demo\b", readme, flags=re.M) and re.search(r"^make test\b", readme, flags=re.M)
    assert "make test" in (REPO / ".ci" / "run").read_text()  # CI runs the command the README gives
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (REPO / target).is_file(), f"the README links to {target}, which does not exist"


def test_the_sections_other_files_cite_are_in_the_site() -> None:
    # Cited by name in docstrings and comments: globald/store/space.py and tests/reliability/test_disk_space.py
    # ("Disk space"), test_auto_create.py ("Limitations"), tests/ci.py ("Test lanes"), tests/tansu/test_transactions.py
    # ("Transactional topics"), globald/common/exitcodes.py ("Exit codes"),
    # globald/common/errors.py (the Spark section).
    cited = {"Disk space", "Limitations", "Test lanes: which broker proves what", "Transactional topics", "Exit codes",
             "Reading while a table rebuilds", "Snapshots and Spark", "Guarantees", "Upgrading", "Benchmarks",
             "Your first global table", "Architecture"}
    assert cited <= headings(), cited - headings()


def test_the_configuration_reference_lists_every_declared_key() -> None:
    from globald.settings.config import Config
    from globald.settings.spec import declared_keys

    page = hooks().config_reference()
    for key in declared_keys(Config):
        assert f"`{key.path}`" in page or f"`[{key.path}]`" in page or f"`[[{key.path}]]`" in page, key.path
    assert "`isolation.level`" in page  # the managed librdkafka properties, from globald.settings.kafka_properties


def test_the_cli_reference_shows_every_command_and_argument() -> None:
    import argparse

    from globald.cli.main import build_parser

    page = hooks().cli_reference()
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():
        assert f"## `globald {name}`" in page and f"usage: globald {name}" in page, name
        for action in parser._actions:
            for option in [] if isinstance(action, argparse._HelpAction) else action.option_strings:
                assert f"`{option}`" in page, (name, option)


def test_the_module_map_lists_every_module() -> None:
    page = hooks().module_map()
    for module in (REPO / "globald").rglob("*.py"):
        if module.name not in ("__init__.py", "__main__.py") and "__pycache__" not in module.parts:
            assert f"`{module.name}`" in page, module


def test_the_home_page_is_the_readme() -> None:
    assert (DOCS / "index.md").read_text().strip() == "<!-- globald:readme -->"


def test_the_architecture_page_shows_the_data_path_and_the_exact_request_path() -> None:
    page = (DOCS / "architecture.md").read_text()
    diagrams = re.findall(r"^```mermaid\n(.*?)^```", page, flags=re.S | re.M)
    assert len(diagrams) >= 2
    for step in ("poll", "update task", "commit", ".checkpoint", "snapshot publisher", "CURRENT", "driver",
                 "descriptor", "executor handle"):
        assert step in diagrams[0], step
    assert "live" in diagrams[0] and "offsets" in diagrams[0]
    for step in ("resolve", "requests/", "build", "responses/"):
        assert step in diagrams[1], step


def test_the_spark_api_reference_shows_each_public_method() -> None:
    from globald.spark import GlobalTableView

    page = hooks().api_reference("globald.spark.GlobalTableView")
    for name in ("refresh", "join", "udf", "foreach_batch"):
        assert callable(getattr(GlobalTableView, name)) and f"`GlobalTableView.{name}(" in page, name
    assert "## API reference" in (DOCS / "spark" / "index.md").read_text()


def sources() -> dict[str, str]:
    pages = {p.relative_to(REPO).as_posix(): p.read_text() for p in DOCS.rglob("*.md")}
    return {**pages, "README.md": (REPO / "README.md").read_text()}


def test_the_files_and_modules_the_docs_name_exist() -> None:
    # A page that names a moved or deleted file, or a `python -m` module that no longer runs, is a page gone stale.
    path = re.compile(r"(?<![\w/.])((?:globald|tests|bench|config|systemd)/[\w./-]+\."
                      r"(?:py|yml|yaml|toml|service|sysusers|md|txt|json))")
    inner = re.compile(r"(?<![\w/.])((?:engine|store|snapshot|spark|ops|status|kafka|typed|embedded)/\w+\.py)")
    stale = []
    for name, text in sources().items():
        stale += [f"{name}: {p}" for p in path.findall(text) if not (REPO / p).exists()]
        stale += [f"{name}: {p}" for p in inner.findall(text) if not (REPO / "globald" / p).exists()]
        stale += [f"{name}: python -m {m}" for m in re.findall(r"python -m ([A-Za-z_][\w.]*)", text)
                  if importlib.util.find_spec(m) is None]
    assert stale == [], stale


def test_where_to_change_what_names_what_the_code_has() -> None:
    # The architecture page's "Where to change what" table, read against the code it points to: a live key is a
    # LIVE line, a part keeping a client compares the ConfigRef's generation, every kind of table change the Delta
    # carries is applied by the engine (engine/tables_change.py, through the TableSet of engine/tables.py, the one
    # owner of the set of tables) and announced as an event its parts take, and a reload is applied in two phases on
    # the parts the daemon lists.
    import inspect
    from dataclasses import fields
    from typing import get_args

    from globald.engine import events, tables, tables_change
    from globald.service import two_phase
    from globald.service.daemon import Daemon
    from globald.settings import changes
    from globald.settings.ref import ConfigRef

    page = (DOCS / "architecture.md").read_text()
    section = page.split("## Where to change what", 1)[1].split("\n## ", 1)[0]
    assert isinstance(changes.LIVE, dict) and isinstance(changes.WHY_NOT, dict)
    assert all(hasattr(ConfigRef, m) for m in ("now", "generation", "get", "set"))
    # Every kind is reached from the engine's apply, directly or through the Delta's stores_added/stores_dropped
    engine = inspect.getsource(tables_change.apply) + inspect.getsource(changes.Delta.stores_added.fget) + \
        inspect.getsource(changes.Delta.stores_dropped.fget)
    kinds = [f.name for f in fields(changes.Delta)
             if f.name in ("added", "dropped", "replaced", "redeclared", "windowed", "unversioned")]
    assert len(kinds) == 6, kinds
    for kind in kinds:
        assert f".{kind}" in engine, f"engine.tables_change.apply does not handle Delta.{kind}"
    table_fields = {f.name for f in fields(changes.Delta)} - {"config", "changes", "kafka_changed"}
    assert table_fields == set(kinds), f"a new kind of table change: say on the page how it lands ({table_fields})"
    for event in get_args(events.TableEvent):
        assert f"`{event.__name__}`" in section, event.__name__
        assert f"emit({event.__name__}(" in inspect.getsource(tables.TableSet), f"{event.__name__} is never emitted"
    apply_tables = inspect.getsource(tables_change.apply)
    assert "tables: TableSet" in apply_tables and "._" not in apply_tables and "loop" not in apply_tables, \
        "tables_change.apply changes the set through the TableSet alone, never the loop's attributes"
    clients = inspect.getsource(Daemon._clients)
    for part in ("consumer", "cluster_worker", "exact_builds", "bootstrap"):  # every part that makes Kafka clients
        assert f'"{part}"' in clients, part
    apply = inspect.getsource(Daemon._reconfigure)
    assert "two_phase.apply(" in apply
    assert all(hasattr(two_phase.Participant, m) for m in ("prepare", "commit", "abort"))
    for name in ("`LIVE`", "`WHY_NOT`", "`Delta`", "`ConfigRef`", "`Daemon._reconfigure`", "`generation`",
                 "`prepare(delta)`", "`abort()`", "`commit()`", "`EngineView`",
                 "`TableSet`", "`engine/tables.py`", "`Daemon._clients`", "`config.clients`"):
        assert name in section, name
