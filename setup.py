"""Package discovery that pyproject.toml cannot express: the engine and CLI live in tools/rlconform, the spec
(its data and its loader, ``rlconform.spec``) in spec/. The suite's own tests (``conformance_tests.meta``) stay in
the source tree, out of the wheel: a checkout runs them (``pytest conformance_tests``), an installed suite has no
use for them."""
from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["reference_impl*", "conformance_tests*"],
                           exclude=["conformance_tests.meta", "conformance_tests.meta.*"])
    + ["rlconform", "rlconform.spec"] + [f"rlconform.{p}" for p in find_packages("tools/rlconform")],
    package_dir={"rlconform": "tools/rlconform", "rlconform.spec": "spec"},
)
