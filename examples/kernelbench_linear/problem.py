"""A problem in KernelBench's format: ReLU(x @ W^T + b), an nn.Linear with its parameters, sizes as module
globals, init inputs for the layer's shape."""
import torch
import torch.nn as nn

batch_size = 2048
in_features = 1024
out_features = 2048


class Model(nn.Module):
    """Linear layer followed by a ReLU."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.fc(x))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
