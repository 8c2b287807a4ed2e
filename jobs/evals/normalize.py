"""Text normalisation options shared by the string-comparing metrics."""

from __future__ import annotations

import re
import string

from pydantic import BaseModel, ConfigDict

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.IGNORECASE)
_WHITESPACE = re.compile(r"\s+")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


class Normalization(BaseModel):
    """How a completion and a reference are cleaned before they are compared.

    Applied in this order: first_line, lowercase, ignore_punctuation, ignore_articles,
    collapse_whitespace, strip.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    first_line: bool = False  # keep only the text before the first newline (after leading blanks)
    lowercase: bool = False
    ignore_punctuation: bool = False  # drop ASCII punctuation
    ignore_articles: bool = False  # drop the English articles a, an, the
    collapse_whitespace: bool = True  # runs of whitespace become one space
    strip: bool = True  # drop leading and trailing whitespace

    def apply(self, text: str) -> str:
        if self.first_line:
            text = text.lstrip("\n").split("\n", 1)[0]
        if self.lowercase:
            text = text.lower()
        if self.ignore_punctuation:
            text = text.translate(_PUNCTUATION)
        if self.ignore_articles:
            text = _ARTICLES.sub(" ", text)
        if self.collapse_whitespace:
            text = _WHITESPACE.sub(" ", text)
        if self.strip:
            text = text.strip()
        return text
