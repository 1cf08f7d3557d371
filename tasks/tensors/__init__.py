"""The built-in tensors task: any model, named tensors as nested JSON lists in and out."""
