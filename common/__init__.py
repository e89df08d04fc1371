"""What every package of looptrace uses, and nothing of looptrace below it: JSON on the per-token
paths, a tokenizer's vocabulary and incremental detokenizing, reading a checkpoint's config, token
sequences, and the names of every span attribute, event and metric (attributes.py)."""
