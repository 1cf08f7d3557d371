"""A fixed, varied list of sentences for checking and measuring text-embedding models.

Deterministic (a seeded generator, no files, no downloads): the same 240 strings on every
machine. Covers what tokenizers and pooling get wrong: the empty string, whitespace only,
leading/trailing spaces, one character, punctuation, numbers, code, accents, non-Latin
scripts (CJK, Arabic, Hebrew, Devanagari, Cyrillic, Greek, Thai, Korean), emoji (incl. ZWJ
sequences and flags), and lengths from 1 to well past 300 tokens (past all-MiniLM-L6-v2's
limit of 256, so truncation is exercised too).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SEED = 24

BASE = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is eating food.",
    "A man is riding a white horse on an enclosed ground.",
    "Two children are playing in the snow near a wooden fence.",
    "The stock market fell sharply after the announcement of new tariffs.",
    "How do I reset my password if I no longer have access to my email?",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "She sells seashells by the seashore.",
    "Is it going to rain tomorrow in Amsterdam?",
    "The meeting has been moved to Thursday at 3 p.m. in room 4B.",
    "Neural networks are universal function approximators, in theory at least.",
    "I can't believe it's not butter!",
    "Please find attached the invoice for March (No. 2024-0317).",
    "The mitochondria is the powerhouse of the cell.",
    'He said: "Don\'t touch that button" -- and then pressed it himself.',
    "Rome wasn't built in a day, but it burned in one.",
    "Our API returns HTTP 429 when you exceed 100 requests per minute.",
    "Cats sleep for around 12 to 16 hours a day.",
    "The train to Berlin departs from platform 7.",
    "Water boils at 100 degrees Celsius at sea level.",
]
NON_LATIN = [
    "我喜欢在周末去公园散步。",
    "東京は日本の首都です。",
    "今日はとても暑いですね、アイスクリームが食べたい。",
    "القطة تجلس على السجادة.",
    "שלום עולם, מה שלומך היום?",
    "मुझे हिंदी में किताबें पढ़ना पसंद है।",
    "Москва — столица России.",
    "Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.",
    "ฉันชอบกินข้าวผัด",
    "안녕하세요, 만나서 반갑습니다.",
    "Ελληνικά και русский и 中文 mixed in one sentence.",
    "Café, naïve, résumé, Zürich, São Paulo, Kraków, Ærøskøbing.",
]
EMOJI = [
    "🙂",
    "I love pizza 🍕🍕🍕",
    "👩‍👩‍👧‍👦 family time",
    "Flags: 🇳🇱 🇯🇵 🇧🇷",
    "🚀 launch in 3... 2... 1... 🔥",
    "thumbs up 👍🏽 and a heart ❤️",
]
ODD = [
    "",
    " ",
    "   \t\n  ",
    "a",
    "?",
    "!!!",
    "42",
    "3.14159265358979323846",
    "   leading spaces",
    "trailing spaces    ",
    "  both sides  ",
    "UPPERCASE SENTENCE SHOUTING",
    "def f(x):\n    return x ** 2  # square",
    "SELECT id, name FROM users WHERE age > 30;",
    "https://example.com/path?query=1&other=two#fragment",
    "e-mail: someone@example.org, tel. +31 20 123 4567",
    "word " * 3,
    "antidisestablishmentarianism",
    "\u00a0non-breaking\u00a0spaces\u00a0",
    "zero\u200bwidth\u200bspace",
]
WORDS = (
    "time person year way day thing man world life hand part child eye woman place work week case point "
    "government company number group problem fact model server request token batch vector memory core "
    "thread process quickly slowly carefully about under over between through during before after "
    "because although while green large small early important public able bad same"
).split()


def _long(rng: random.Random, words: int) -> str:
    """A long pseudo-text of `words` words, sentences of 5 to 15 words."""
    out: list[str] = []
    while len(out) < words:
        sentence = [rng.choice(WORDS) for _ in range(rng.randint(5, 15))]
        sentence[0] = sentence[0].capitalize()
        out += sentence
        out[-1] += rng.choice([".", ".", "!", "?"])
    return " ".join(out[:words])


def sentences() -> list[str]:
    """240 sentences, always the same, in a fixed order."""
    rng = random.Random(SEED)
    items = [*BASE, *NON_LATIN, *EMOJI, *ODD]
    # Pairs and triples of the fixed sentences: medium lengths, mixed scripts.
    pool = BASE + NON_LATIN + EMOJI
    while len(items) < 180:
        items.append(" ".join(rng.sample(pool, rng.randint(2, 3))))
    # Long texts: 40 to 400 words (roughly 45 to 450 tokens).
    for words in [40, 60, 80, 100, 120, 150, 180, 200, 230, 250, 280, 300, 350, 400]:
        items.append(_long(rng, words))
    # Long non-Latin text (CJK: about one token per character).
    items.append("".join(rng.choice(NON_LATIN[:3]) for _ in range(20)))
    items.append(" ".join(rng.choice(EMOJI) for _ in range(60)))
    while len(items) < 240:
        items.append(_long(rng, rng.randint(1, 60)))
    return items


def split(folder: Path) -> tuple[Path, Path]:
    """The 240 sentences as two JSON files for `onnxpool quantize` of a text model: the even
    ones to choose the recipe on (search-sentences.json), the odd ones held out to judge it
    (eval-sentences.json). Both halves have every kind of string and length."""
    items = sentences()
    search, held_out = folder / "search-sentences.json", folder / "eval-sentences.json"
    search.write_text(json.dumps(items[0::2], ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    held_out.write_text(json.dumps(items[1::2], ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    return search, held_out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=split.__doc__)
    parser.add_argument("--split", type=Path, required=True, metavar="FOLDER")
    for written in split(parser.parse_args().split):
        print(written)
