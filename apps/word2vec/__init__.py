"""Word2vec (skip-gram, negative sampling) with ``sync_for`` on gensim's test corpora
(``replay run word2vec``)."""

from __future__ import annotations

from ._app import train as train

__all__ = ["train"]
