"""ATTACK on the verdict: the kernel writes NaN, then patches the harness's json.dumps (it shares the process) so
its result claims there are no outputs to judge. Its process finds json.dumps replaced after its first request
(TAMPERED); were that check defeated too, which outputs are judged comes from the reference's process, never from
the candidate's (INCORRECT_NUMERICAL)."""
import json

import torch

_dumps = json.dumps


def _claim_no_outputs(obj, *args, **kwargs):
    if isinstance(obj, dict) and "guards" in obj and "outputs" in obj:
        obj = {**obj, "outputs": []}
    return _dumps(obj, *args, **kwargs)


json.dumps = _claim_no_outputs


def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, N, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}


def run_kernel(x, y):
    y.fill_(float("nan"))
