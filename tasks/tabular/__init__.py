"""The built-in tabular task: KServe v1 instances of named features in, labels and probabilities out."""
