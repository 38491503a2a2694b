"""A static cache layer with a write position per row: the greedy answer baseline's decoding cache
(:mod:`rredcot.method.answer_baseline`). A module of its own so that importing the method does not
import transformers' cache classes before a decode needs them."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from transformers.cache_utils import StaticLayer


class RowLayer(StaticLayer):
    """One layer's keys and values with a write position per row (``at``, shared by every layer).

    A row's cache holds its head at slots ``[0, head_len)`` and what it decoded at slots ``[width,
    at)``; a step writes its tokens at ``at`` on, over tokens that an earlier step rejected. The keys
    and values keep the prefill's dtypes (under autocast with float32 weights the keys come out in
    float32, the values in the autocast dtype)."""

    def __init__(self, keys: Tensor, values: Tensor, capacity: int, at: Tensor) -> None:
        super().__init__(max_cache_len=capacity)
        width = keys.shape[2]
        self.keys = keys.new_zeros(*keys.shape[:2], capacity, keys.shape[3])
        self.values = values.new_zeros(*values.shape[:2], capacity, values.shape[3])
        self.keys[:, :, :width], self.values[:, :, :width] = keys, values
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self.at = at

    def get_seq_length(self) -> int:
        """Slots a step's tokens attend over, besides their own (what the memory budget counts)."""
        return self.max_cache_len

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any):  # noqa: ANN201
        n = key_states.shape[2]
        index = (self.at[:, None] + torch.arange(n, device=self.at.device))[:, None, :, None]
        self.keys.scatter_(2, index.expand_as(key_states), key_states.to(self.keys.dtype))
        self.values.scatter_(2, index.expand_as(value_states), value_states.to(self.values.dtype))
        return self.keys, self.values
