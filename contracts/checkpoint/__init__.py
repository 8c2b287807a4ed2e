"""What a checkpoint folder must say for the engine to load it: config.json's architecture, shape,
window and rope rules, and the sentence-transformers pooling config of an embedding model."""
