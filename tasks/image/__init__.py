"""The built-in image-classification task: preprocessing (imaging), multipart forms, top-k labels."""
