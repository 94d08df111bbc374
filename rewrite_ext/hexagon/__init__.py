"""Hexagon lowering: staging into VTCM, the copy-to-DMA reference rewrite, and CPU stand-ins."""

from __future__ import annotations

from .cpu_dma import CPUDMA, DMAError, cpu_dma
from .dma import DMA_COPY, DMA_WAIT, CopyToDMA, DMAChunkWarning, copy_tensor_pattern, copy_to_dma
from .overlap import TransferOverlap, format_overlap_report, overlap_report, sink_dma_waits
from .vtcm import (
    CPUVTCM,
    VTCM_BLOCK_BYTES,
    VTCM_SCOPE,
    LowerToVMIR,
    StagedTensor,
    VTCMCapacityWarning,
    VTCMPlan,
    cpu_vtcm,
    plan_vtcm,
    stage_in_vtcm,
    vtcm_capacity,
)

__all__ = [
    "CPUDMA",
    "CPUVTCM",
    "DMA_COPY",
    "DMA_WAIT",
    "VTCM_BLOCK_BYTES",
    "VTCM_SCOPE",
    "CopyToDMA",
    "DMAChunkWarning",
    "DMAError",
    "LowerToVMIR",
    "StagedTensor",
    "TransferOverlap",
    "VTCMCapacityWarning",
    "VTCMPlan",
    "copy_tensor_pattern",
    "copy_to_dma",
    "cpu_dma",
    "cpu_vtcm",
    "format_overlap_report",
    "overlap_report",
    "plan_vtcm",
    "sink_dma_waits",
    "stage_in_vtcm",
    "vtcm_capacity",
]
