"""The package's layout for setuptools (the project's metadata is in pyproject.toml).

posenc/ and its subpackages install as themselves; the root folders configs/
and experiments/ (the configs and the commands, at the top level of the
repository) install into the package as posenc.configs and posenc.experiments,
for editable and non-editable installs alike. A new subpackage needs no entry
here.
"""

from setuptools import find_packages, setup

ROOT_FOLDERS = {"posenc.configs": "configs", "posenc.experiments": "experiments"}

ROOT_PACKAGES = [f"{package}.{sub}" if sub else package for package, folder in ROOT_FOLDERS.items()
                 for sub in ("", *find_packages(folder))]  # with their subpackages (configs/compare_grids)

setup(packages=[*find_packages(include=["posenc", "posenc.*"]), *ROOT_PACKAGES], package_dir=ROOT_FOLDERS)
