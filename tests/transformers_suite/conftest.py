# The stand-ins here are named like test modules (`test_export.py`, ...) because transformers' test files import
# them under those names; they hold mixins, not tests, and run only through tests/test_transformers_common.py.
collect_ignore_glob = ["*.py"]
