"""Task resolution: optimum's task name and the model's config give the form of the task the export takes (its
auto class, runtime class and graph inputs). The exports themselves are measured end to end by the tasks' zoo
(tests/zoo_tasks.py) and test_forward_tasks.py."""

import pytest
from transformers import AutoConfig

from optimum_dynamo.tasks import resolve_task

from conftest import ENVIRONMENT


@pytest.mark.parametrize("model_type, task, auto_class, runtime_class, inputs", [
    # semantic segmenters: optimum's own class for the task
    ("segformer", "image-segmentation", "AutoModelForSemanticSegmentation", "ORTModelForSemanticSegmentation", None),
    # a class and a mask per query: the universal / instance mappings, the generic class, the pixels only
    ("maskformer", "image-segmentation", "AutoModelForUniversalSegmentation", "ORTModelForCustomTasks",
     ("pixel_values",)),
    ("mask2former", "image-segmentation", "AutoModelForUniversalSegmentation", "ORTModelForCustomTasks",
     ("pixel_values",)),
    pytest.param("rf_detr", "image-segmentation", "AutoModelForInstanceSegmentation", "ORTModelForCustomTasks",
                 ("pixel_values",), marks=pytest.mark.skipif(ENVIRONMENT == "t4", reason="RF-DETR is new in transformers 5")),
    ("wav2vec2", "automatic-speech-recognition", "AutoModelForCTC", "ORTModelForCTC", None),
    ("whisper", "automatic-speech-recognition", "AutoModelForSpeechSeq2Seq", "ORTModelForSpeechSeq2Seq", None),
    # a dual encoder's features: texts and images in, both towers' embeddings out
    ("clip", "feature-extraction", "AutoModelForZeroShotImageClassification", "ORTModelForCustomTasks",
     ("input_ids", "attention_mask", "pixel_values")),
    ("siglip", "feature-extraction", "AutoModelForZeroShotImageClassification", "ORTModelForCustomTasks",
     ("input_ids", "attention_mask", "pixel_values")),
    ("bert", "feature-extraction", None, "ORTModelForFeatureExtraction", None),
])
def test_the_task_takes_the_form_that_fits_the_model(model_type, task, auto_class, runtime_class, inputs):
    config = AutoConfig.for_model(model_type)
    resolved = resolve_task(task, "a-checkpoint", config)
    assert (resolved.base, resolved.spec.auto_class, resolved.spec.runtime_class, resolved.spec.inputs) == (
        task, auto_class, runtime_class, inputs)
