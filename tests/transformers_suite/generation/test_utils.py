"""Stand-in for transformers' `tests/generation/test_utils.py`, which its sdist does not ship.

`ModelTesterMixin.test_generation_tester_mixin_inheritance` checks that a test class inherits
`GenerationTesterMixin` exactly when its models can `generate`; none of ours can, so a marker class is all
the check needs (no generation tests are run).
"""


class GenerationTesterMixin:
    """Marker: the tests of models that can `generate` inherit it (none of ours do)."""
