"""``stream-dp schema``: the query file's JSON Schema, or its reference page, generated from the models.

``deploy/schemas/queries.schema.json`` and ``docs/reference/query-file.md`` are this command's output,
committed; tests fail when either differs from what the models generate.
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "schema",
        help="print the query file's JSON Schema (or its reference page)",
        description="Print the JSON Schema (draft-07) of the query file, generated from the models the worker "
        "validates it with, for editors to validate and complete query files; with --markdown, the reference "
        "page of every setting instead.",
    )
    parser.add_argument("--markdown", action="store_true",
                        help="print the reference page (docs/reference/query-file.md) instead of the schema")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.markdown:
        from stream_dp.config.reference import query_file_reference

        sys.stdout.write(query_file_reference())
    else:
        from stream_dp.config.schema import query_file_schema_text

        sys.stdout.write(query_file_schema_text())
    return 0
