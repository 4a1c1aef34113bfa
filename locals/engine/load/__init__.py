"""Loading: a model name to weights, tokenizer, chat template and the device it runs on."""
