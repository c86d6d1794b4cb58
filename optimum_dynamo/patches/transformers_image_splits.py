"""Image features split per image by sizes that stay symbolic.

transformers 5's Mistral3 (a Pixtral tower, images of any size) splits the projected features with
`torch.as_tensor(image_sizes) // ratio` and `.tolist()`: under torch.export the image's height and width are
symbolic, and `as_tensor` makes them constants, so the export fails ("specialized it to be a constant"). The patch
computes the same split sizes with integer arithmetic on the sizes as given (transformers 4's way).
"""

import torch

from .registry import register_patch

_REASON = "split sizes from the image sizes as ints (torch.as_tensor turns symbolic sizes into constants)"


_TARGET = "transformers.models.mistral3.modeling_mistral3.Mistral3Model.get_image_features"


def _image_features(self, pixel_values, image_sizes, vision_feature_layer, kwargs):
    layer = self.config.vision_feature_layer if vision_feature_layer is None else vision_feature_layer
    kwargs = {k: v for k, v in kwargs.items() if v is not None and k not in ("return_dict", "output_hidden_states")}
    tower = self.vision_tower(pixel_values, image_sizes=image_sizes, output_hidden_states=True, return_dict=True,
                              **kwargs)
    selected = torch.cat([tower.hidden_states[i] for i in ([layer] if isinstance(layer, int) else layer)], dim=-1)
    features = self.multi_modal_projector(selected.squeeze(0), image_sizes)
    ratio = self.vision_tower.patch_size * self.config.spatial_merge_size
    tower.pooler_output = torch.split(features.squeeze(0), [(h // ratio) * (w // ratio) for h, w in image_sizes])
    return tower


@register_patch(_TARGET, versions={"transformers": ">=5.18"}, reason=_REASON)
def mistral3_image_features(self, pixel_values, image_sizes, vision_feature_layer=None, **kwargs):
    return _image_features(self, pixel_values, image_sizes, vision_feature_layer, kwargs)


@register_patch(_TARGET, versions={"transformers": ">=5,<5.18"}, reason=_REASON)
def mistral3_image_features_hidden_states(self, pixel_values, image_sizes, vision_feature_layer=None,
                                          output_hidden_states=None, **kwargs):
    return _image_features(self, pixel_values, image_sizes, vision_feature_layer, kwargs)
