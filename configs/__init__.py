"""The packaged configs: ``--config NAME[:ARG]`` of the commands (``python -m posenc <command>``).

This folder sits at the repository root and installs as ``posenc.configs``
(``pyproject.toml``); in a checkout ``--config configs/compare.py:quick`` names
the same config by its file.

    default    one run: a small decoder on copy (``:ARG`` variant words: task, encoding, ...)
    compare    the comparison grids (``compare:quick``, ``:full``, ``:lm``, ...)
    extend     the context-extension studies (``extend:quick``, ``:retrieval``, ...)
    stability  the training-stability studies (``stability:quick``, ...)

Each module's ``get_config(arg=None)`` returns an ml_collections ConfigDict;
``--config default:tiny`` calls ``posenc.configs.default.get_config("tiny")``
(posenc.config.cli). A config file of your own (``--config path/to/mine.py:ARG``)
may start from these: ``from posenc.configs import default``.
"""
