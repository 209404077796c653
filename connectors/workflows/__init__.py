"""Workflows in the catalog: several actions that hold together, and how to undo them.

    references.py   the values a step receives: literals, $input/$steps references, templates
    spec.py         the ``workflow:`` document (WorkflowSpec, StepSpec, CompensateSpec)
    check.py        step contracts checked when the catalog loads (file and line)

The runner that drives a run lives in workers/workflows/.
"""
