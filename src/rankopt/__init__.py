"""rankopt: train and evaluate image-retrieval embeddings by directly optimizing rank metrics."""

__version__ = "0.1.0"
