"""On PYTHONPATH only for the documentation's bash examples (tests/test_docs_examples.py):
scripted models in every Python process they start (tests/doc_env.py)."""

from tests.doc_env import install_in_subprocess

install_in_subprocess()
