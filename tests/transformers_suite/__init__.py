"""transformers' own common model tests, fetched for the installed transformers, and what they need from us.

`sdist.fetch` (run by `make data`) downloads transformers' source distribution and extracts its common test files;
`sdist.load` imports them, offline, as the package `transformers_tests`. The sdist lacks three modules those files import; this folder is the second
half of that package's path and supplies them under the same names:

* `exporters/test_export.py`: `ExportTesterMixin` (the `torch.export` tests `ModelTesterMixin` inherits);
* `generation/test_utils.py`: `GenerationTesterMixin`, a marker class;
* `utils/test_configuration_utils.py`: `config_common_kwargs`.

They are named like test modules because transformers imports them under these names; `conftest.py` keeps
pytest from collecting them on their own.
"""
