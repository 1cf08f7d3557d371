"""Building blocks of text-embedding models: tokenizing, pooling, sub-batch planning, OpenAI's schema.

Pure functions and small classes over numpy arrays: the worker's one onnxruntime session
runs the model, the server owns HTTP; nothing here imports either.
"""
