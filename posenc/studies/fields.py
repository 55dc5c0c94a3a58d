"""The field tables of the documentation, generated from the declarations (never written by hand).

    python -m posenc.studies.fields                # every field, as docs/config.md, on stdout
    python -m posenc.studies.fields --write .      # rewrite README.md's table and docs/config.md
                                                       # of the checkout in . (developers)

README.md holds the run's fields (:func:`run_table`) between the markers
``<!-- fields:run -->`` and ``<!-- /fields:run -->``; docs/config.md holds
every field: the run's, each encoding's options and each study's own
(:func:`config_doc`). A test checks both against these functions and sets
every listed field from the command line.
"""

from __future__ import annotations

import os
import re
import sys

from posenc.config import schema
from posenc.training import schema as run_schema

BEGIN, END = "<!-- fields:run -->", "<!-- /fields:run -->"


def run_rows() -> list[tuple[str, str, str]]:
    return run_schema.field_rows()


def encoding_rows() -> dict[str, list[tuple[str, str, str]]]:
    """``{encoding: rows}`` of every built-in encoding with options (``model.position.<name>.*``)."""
    from posenc.model import ENCODINGS
    from posenc.model import options as options_lib

    out = {}
    for name, cls in sorted(ENCODINGS.items()):
        opts = options_lib.options_of(cls) if cls.__module__.startswith("posenc.") else {}
        if opts:
            section = schema.options_section(cls.__name__, opts)
            out[name] = schema.rows(section, f"model.position.{name}")
    return out


def study_rows() -> dict[str, list[tuple[str, str, str]]]:
    """``{study: rows}`` of each study's own fields (its ``base`` is a run config, listed apart)."""
    from posenc import studies
    from posenc.studies import engine

    engine.study("compare")  # imports every study
    return {name: schema.rows(s.schema, "", skip=("base",)) for name, s in sorted(studies.STUDIES.items())}


def run_table() -> str:
    return schema.markdown_table(run_rows())


def config_doc() -> str:
    lines = ["# Config fields", "",
             "Generated from the declarations by `python -m posenc.studies.fields --write .` (without "
             "`--write` it prints this page); every field is "
             "settable with `--config.<field>=<value>` (text parsed into the field's type; tuples as "
             "`(32,64)` or `32,64`, mappings as JSON). An unknown field fails in one line naming the "
             "closest valid one, however the config was built.", "",
             "## A run (the default config; `base.*` of every study)", "", run_table(),
             "## Encoding options (`model.position.<kind>.*`)", "",
             "A field the chosen encodings do not use is an error when set.", ""]
    for name, rows in encoding_rows().items():
        lines += [f"### {name}", "", schema.markdown_table(rows)]
    lines += ["## Studies (`--config` of python -m posenc compare, extend, stability)", ""]
    for name, rows in study_rows().items():
        lines += [f"### {name}", "", schema.markdown_table(rows)]
    return "\n".join(lines)


def replace_between(text: str, body: str) -> str:
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"no {BEGIN} ... {END} block to replace")
    return pattern.sub(lambda _: f"{BEGIN}\n{body}{END}", text)


def write(root: str) -> list[str]:
    """Rewrite README.md's run-field table and docs/config.md under ``root``; the paths written."""
    from posenc.workdir import files

    readme = os.path.join(root, "README.md")
    with open(readme) as f:
        files.atomic_write(readme, replace_between(f.read(), run_table()))
    doc = os.path.join(root, "docs", "config.md")
    files.atomic_write(doc, config_doc())
    return [readme, doc]


def main(argv: list[str]) -> int:
    """Print every field (stdout); ``--write ROOT`` rewrites ROOT's README.md table and docs/config.md."""
    if not argv:
        sys.stdout.write(config_doc())
        return 0
    if argv[0] != "--write" or len(argv) != 2:
        print("usage: python -m posenc.studies.fields [--write ROOT]", file=sys.stderr)
        return 2
    root = argv[1]
    missing = [p for p in ("README.md", os.path.join("docs", "config.md"))
               if not os.path.exists(os.path.join(root, p))]
    if missing:
        print(f"error: {os.path.abspath(root)} is not a posenc checkout (no {missing[0]}); --write takes "
              "the repository's root", file=sys.stderr)
        return 2
    for path in write(root):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
