"""Generation capture: observe forward calls, infer export arguments and dynamic shapes."""

from .drivers import (
    drive_forward,
    drive_image_forward,
    drive_multiple_choice,
    drive_seq2seq_generation,
    drive_text_forward,
    drive_text_and_images,
    drive_text_generation,
    text_samples,
)
from .infer import CaptureError, ExportArguments, infer_arguments
from .observer import Call, InputObserver, observe, snapshot

__all__ = [
    "Call",
    "CaptureError",
    "ExportArguments",
    "InputObserver",
    "drive_forward",
    "drive_image_forward",
    "drive_multiple_choice",
    "drive_seq2seq_generation",
    "drive_text_forward",
    "drive_text_and_images",
    "drive_text_generation",
    "infer_arguments",
    "observe",
    "snapshot",
    "text_samples",
]
