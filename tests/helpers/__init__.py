"""Helpers shared by the tests (importable as ``helpers`` because pytest puts tests/ on ``sys.path``).

- ``fake_engine`` — ``FakeEngine``, a weightless stand-in with the engine's interface, and the
  tokenizer and special ids the generation and chat tests use.
- ``book``        — where the repository is, and the built book the book tests need.
- ``logits``      — ``compare_steps``: prefill and every decode step against reference logits.
"""
