"""Package discovery that pyproject.toml cannot express: the CLI lives in tools/ and the spec data in spec/."""
from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["reference_impl*", "conformance_tests*"])
    + ["rlconform", "rlconform.specdata"],
    package_dir={"rlconform": "tools/rlconform", "rlconform.specdata": "spec"},
)
