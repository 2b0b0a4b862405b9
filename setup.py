"""Maps the top-level folder kernels/ to the import name `microscope_kernels`.

The design card puts one room per optimization under kernels/, but a top-level import name `kernels`
collides with an unrelated package on PyPI. So the folder keeps its name and is installed (and, in an
editable install, found) as `microscope_kernels`; everything else lives in pyproject.toml.
"""

from setuptools import find_packages, setup

harness = find_packages(include=["microscope", "microscope.*"])
rooms = ["microscope_kernels" + name[len("kernels"):] for name in find_packages(include=["kernels", "kernels.*"])]

setup(
    packages=harness + rooms,
    package_dir={"microscope_kernels": "kernels"},
    package_data={"microscope": ["report/templates/*"], "microscope_kernels.flash_attn": ["tuned/*.json"]},
)
