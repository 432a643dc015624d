"""The prompt a real run feeds its model: the user's text, or N tokens of real text.

    ids, what = prompt_ids(tokenizer, None, 128, vocab_size)   # 128 tokens of PASSAGE

A run measures a prompt of --prompt_length tokens (128 by default: generate.py's shared
flags). Random token ids of that length are what a model never reads, and what it writes
after them is gibberish; so where the checkpoint has a tokenizer that fits the model, the
prompt is PASSAGE — the opening of Lewis Carroll's "Alice's Adventures in Wonderland" (1865,
in the public domain) — encoded by the model's own tokenizer and cut to exactly N tokens
(repeated, a blank line between, where N is longer than it), and the generated text reads
as a continuation of it. Without a tokenizer, or with one whose ids the model has no
embedding for, the prompt is N random token ids, as before, and `what` says so.
"""
from __future__ import annotations

import torch

from perfcounter.models.tokenizer import TokenizerError, encode_prompt

PASSAGE = (
    "Alice was beginning to get very tired of sitting by her sister on the bank, and of "
    "having nothing to do: once or twice she had peeped into the book her sister was "
    "reading, but it had no pictures or conversations in it, \"and what is the use of a "
    "book,\" thought Alice \"without pictures or conversations?\"\n\n"
    "So she was considering in her own mind (as well as she could, for the hot day made her "
    "feel very sleepy and stupid), whether the pleasure of making a daisy-chain would be "
    "worth the trouble of getting up and picking the daisies, when suddenly a White Rabbit "
    "with pink eyes ran close by her.\n\n"
    "There was nothing so very remarkable in that; nor did Alice think it so very much out "
    "of the way to hear the Rabbit say to itself, \"Oh dear! Oh dear! I shall be late!\" "
    "(when she thought it over afterwards, it occurred to her that she ought to have "
    "wondered at this, but at the time it all seemed quite natural); but when the Rabbit "
    "actually took a watch out of its waistcoat-pocket, and looked at it, and then hurried "
    "on, Alice started to her feet, for it flashed across her mind that she had never "
    "before seen a rabbit with either a waistcoat-pocket, or a watch to take out of it, and "
    "burning with curiosity, she ran across the field after it, and fortunately was just in "
    "time to see it pop down a large rabbit-hole under the hedge.")


def passage_ids(tokenizer, length: int, vocab_size: int) -> list[int]:
    """Exactly `length` token ids of PASSAGE in `tokenizer` (repeated where it is shorter);
    TokenizerError where its ids do not fit a model of `vocab_size` tokens."""
    text, ids = PASSAGE, encode_prompt(tokenizer, PASSAGE, vocab_size)
    while len(ids) < length:  # a blank line between the copies, as between its paragraphs
        text += "\n\n" + PASSAGE
        ids = encode_prompt(tokenizer, text, vocab_size)
    return ids[:length]


def prompt_ids(tokenizer, prompt: str | None, prompt_length: int | None,
               vocab_size: int) -> tuple[list[int] | None, str]:
    """(the prompt's token ids, or None for `prompt_length` random ids; what the prompt is,
    for the run's log): the text `prompt` where given (prompt_length None), else
    `prompt_length` tokens of PASSAGE where `tokenizer` fits the model, else random ids."""
    if prompt_length is None:
        return encode_prompt(tokenizer, prompt, vocab_size), "the given text"
    if tokenizer is None:
        return None, f"{prompt_length} random token ids (no tokenizer beside the checkpoint)"
    try:
        return (passage_ids(tokenizer, prompt_length, vocab_size),
                f"{prompt_length} tokens of the built-in text (the opening of \"Alice's "
                "Adventures in Wonderland\"; --prompt TEXT gives your own)")
    except TokenizerError as e:
        return None, f"{prompt_length} random token ids (the built-in text: {e})"


def prompt_tensor(tokenizer, prompt: str | None, prompt_length: int | None, vocab_size: int,
                  batch: int, device) -> tuple[torch.Tensor, str]:
    """([batch, S] token ids on `device`, what the prompt is): prompt_ids, each row alike."""
    ids, what = prompt_ids(tokenizer, prompt, prompt_length, vocab_size)
    if ids is None:
        return torch.randint(0, vocab_size, (batch, prompt_length), device=device), what
    return torch.tensor(ids, dtype=torch.int64, device=device).repeat(batch, 1), what
