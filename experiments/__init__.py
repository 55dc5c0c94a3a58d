"""The commands: ``python -m posenc <command> [flags]`` (or ``posenc <command>``) anywhere
after installing posenc; ``python -m experiments.<command> [flags]`` in a checkout.

    train      train one config, evaluate it at every eval length, write its report
    compare    a comparison grid (posenc.studies.compare)
    extend     the context-extension study (posenc.studies.extend)
    stability  the training-stability study (posenc.studies.stability)
    report     rebuild the report of any study or run from its rows
    findings   the findings of a finished comparison grid, and its figures
    analyze    where a trained run's attention looks, what its positions learned

This folder sits at the repository root and installs as ``posenc.experiments``
(``pyproject.toml``), so the same modules run either way. Each command is a
thin module (``define_flags()``, ``main(argv)``) over one library call;
:mod:`runtime` holds what they share (flags, start-up, one-line errors).
``--config`` takes a packaged config by name (``default:tiny``,
``compare:quick``: the root folder configs/) or a file (``path/to/file.py[:ARG]``,
e.g. ``configs/compare.py:quick`` in a checkout). ``python -m posenc --help``
lists the commands.

Every command (and the test suite, tests/conftest.py) keeps JAX's persistent
compilation cache (:mod:`posenc.training.compile_cache`).
"""
