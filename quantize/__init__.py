"""`onnxpool quantize`: static INT8 of a float model, measured against FP32 (pipeline.py has the steps)."""
