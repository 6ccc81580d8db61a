"""The tests' Schema Registry: the local one ``globald dev --registry`` serves (``globald/embedded/registry.py``), under
the name the tests have always used. One piece of code: what the page's walkthrough runs is what the tests run."""

from globald.embedded.registry import LocalRegistry as RegistryDouble

__all__ = ["RegistryDouble"]
