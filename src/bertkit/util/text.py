"""Plain text rules shared by the data pipeline, the metrics and the explorer.

- `has_cjk`: what counts as a CJK ideograph, as BERT's tokenizer defines it;
- `split_sentences`: a paragraph into sentences. Chinese ends at 。！？；… (closing quotes kept
  with their sentence); English at . ! ? followed by a space and a capital, digit or quote, where
  common abbreviations (Mr. Dr. e.g. U.S. etc.) and single initials do not end a sentence.

Small and free of heavy imports, so corpus readers and preparation workers start fast.
"""

from __future__ import annotations

import re

# CJK ideographs as BERT's tokenizer defines them (`_is_chinese_char`): these become one token each.
_CJK = re.compile("[\u4e00-\u9fff\u3400-\u4dbf\uf900-\ufaff\U00020000-\U0002a6df"
                  "\U0002a700-\U0002b73f\U0002b740-\U0002b81f\U0002b820-\U0002ceaf"
                  "\U0002f800-\U0002fa1f]")


def has_cjk(text: str) -> bool:
    """Whether text holds a CJK ideograph (then jieba decides word boundaries, and answers are
    scored per character)."""
    return _CJK.search(text) is not None


# ---------------------------------------------------------------------------------------------
# sentence splitting (Chinese and English rules)
# ---------------------------------------------------------------------------------------------
_CLOSERS = re.escape("\"'”’」』）)》】]")
# A candidate sentence end: Chinese terminal punctuation (no space needed after it), or Western
# . ! ? (a run, e.g. "?!" or "...") with its closing quotes, before whitespace or a CJK character.
_CANDIDATE = re.compile(
    rf"(?P<zh>(?:[。！？；]|…+)[{_CLOSERS}]*)"
    rf"|(?P<en>[.!?]+[{_CLOSERS}]*)(?=\s|[\u3400-\u9fff])"
)
# Words whose final period does not end a sentence (compared lowercased, without that period).
ABBREVIATIONS = frozenset("""
    mr mrs ms dr prof st jr sr rev gen col lt sgt capt cmdr gov sen rep pres hon messrs mme mlle
    vs etc e.g i.e cf al approx dept est fig no nos vol vols pp ed eds inc ltd co corp plc bros
    jan feb mar apr jun jul aug sep sept oct nov dec mon tue wed thu fri sat sun
    u.s u.k u.n e.u a.m p.m mt ft
""".split())
_INITIALS = re.compile(r"^(?:[A-Za-z]\.)*[A-Za-z]$")  # "J" of "J. Smith", "U.S" of "U.S."


def split_sentences(text: str) -> list[str]:
    """Split a paragraph into sentences (Chinese and English rules; see the module docstring).

    Line breaks always end a sentence. Whitespace around sentences is stripped, empty ones dropped.
    """
    sentences: list[str] = []
    for line in text.splitlines():
        start = 0
        for match in _CANDIDATE.finditer(line):
            end = match.end()
            if match.group("en") is not None and not _ends_english_sentence(line, match):
                continue
            piece = line[start:end].strip()
            if piece:
                sentences.append(piece)
            start = end
        piece = line[start:].strip()
        if piece:
            sentences.append(piece)
    return sentences


def _ends_english_sentence(line: str, match: re.Match) -> bool:
    punct = match.group("en")
    rest = line[match.end():].lstrip()
    if not rest:
        return True
    if rest[0].islower():  # "e.g. the", "3 p.m. yesterday", '"Hi!" said he': not an end
        return False
    if not punct.startswith(".") or punct.startswith("..."):  # ! ? and an ellipsis before a capital
        return True
    before = line[:match.start()].split()
    word = before[-1].lstrip("(\"'“‘") if before else ""
    return not (word.lower() in ABBREVIATIONS or _INITIALS.match(word))
