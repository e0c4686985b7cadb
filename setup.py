"""Package discovery that pyproject.toml cannot express: the CLI lives in tools/ and the spec data in spec/;
the suite's own meta-tests (``test_meta_*``, the docs-site tests) stay in the source tree, out of the wheel."""
import fnmatch

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

# Tests of the suite and of this repository (its docs site), not of an implementation: a checkout runs
# them (`pytest conformance_tests`), an installed suite has no use for them.
DEV_ONLY = ("conformance_tests/test_meta_*.py", "conformance_tests/test_site.py")


class BuildPyWithoutDevTests(build_py):
    def find_package_modules(self, package, package_dir):
        return [(pkg, mod, path) for pkg, mod, path in super().find_package_modules(package, package_dir)
                if not any(fnmatch.fnmatch(path.replace("\\", "/"), pat) for pat in DEV_ONLY)]


setup(
    packages=find_packages(include=["reference_impl*", "conformance_tests*"])
    + ["rlconform", "rlconform.specdata"],
    package_dir={"rlconform": "tools/rlconform", "rlconform.specdata": "spec"},
    cmdclass={"build_py": BuildPyWithoutDevTests},
)
