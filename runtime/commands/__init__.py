"""Command groups of the ``rlx`` CLI, one module per group (see ``runtime.cli``)."""
