"""Importing an OpenAPI document (Swagger 2.0, OpenAPI 3.0 or 3.1) as a catalog connector.

``reach import openapi`` turns each chosen operation into a semantic action and writes the
connector as YAML meant to be edited: the descriptions are where people add business meaning.
Every function here is pure (document in, catalog text out); the CLI reads and writes files.

    read_document(bytes)         -> dict          document.py: bounded bytes, values (YAML aliases), nesting;
                                                  no $ref outside the document
    document_problems(dict, ops) -> [str]         document.py: openapi-spec-validator, reading nothing else, on
                                                  the chosen operations and what they reach by $ref (subtree)
    plan(dict, options)          -> [Operation]   importer.py: --include / --exclude, and the --max guard
    build_catalog(dict, options) -> ImportResult  importer.py: each operation an action (actions.py: params,
                                                  answer; bodies.py: JSON, form, multipart, bytes; fields.py
                                                  and shapes.py: schemas; access.py:
                                                  endpoint and auth), as YAML (render.py, text.py) that is
                                                  checked against the catalog models, so it passes `reach validate`

What cannot become a field of the http connector is left out and said so: a comment above the
action for a lost detail, the header's list for an operation not imported. A document is
hostile input too: its ``$ref`` chains, cycles, schema depth and the fields one action may
expand to are all bounded, and no text of it can escape the comments it is quoted in.
"""

from connectors.openapi.document import (
    MAX_DOCUMENT_BYTES,
    OpenAPIError,
    Operation,
    OptionsError,
    TooManyOperations,
    document_problems,
    operations,
    read_document,
    spec_version,
)
from connectors.openapi.importer import (
    DEFAULT_MAX_OPERATIONS,
    ImportOptions,
    ImportResult,
    build_catalog,
    import_openapi,
    plan,
)

__all__ = [
    "DEFAULT_MAX_OPERATIONS",
    "MAX_DOCUMENT_BYTES",
    "ImportOptions",
    "ImportResult",
    "OpenAPIError",
    "Operation",
    "OptionsError",
    "TooManyOperations",
    "build_catalog",
    "document_problems",
    "import_openapi",
    "operations",
    "plan",
    "read_document",
    "spec_version",
]
