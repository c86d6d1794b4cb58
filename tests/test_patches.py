"""The patch registry: version gates, signature checks, restore on exit and on failure."""

import subprocess
import sys

import pytest
import torch
import torch.utils._pytree as pytree
import transformers.masking_utils as masking_utils
import transformers.models.llama.modeling_llama as modeling_llama
from transformers import DynamicCache, __version__ as transformers_version

from optimum_dynamo import patches
from optimum_dynamo.exporters import export_onnx


def test_mask_patch_is_active_for_this_transformers():
    active = [p.target for p in patches.active_patches()]
    assert active.count("transformers.masking_utils._ignore_causal_mask_sdpa") == 1


def test_applied_swaps_and_restores():
    original = masking_utils._ignore_causal_mask_sdpa
    with patches.applied():
        assert masking_utils._ignore_causal_mask_sdpa is not original
        assert patches.original("transformers.masking_utils._ignore_causal_mask_sdpa") is original
    assert masking_utils._ignore_causal_mask_sdpa is original


def test_changed_signature_fails_when_applied():
    @patches.register_patch("transformers.masking_utils._ignore_causal_mask_sdpa")
    def wrong(padding_mask):
        return False

    original = masking_utils._ignore_causal_mask_sdpa
    try:
        with pytest.raises(patches.PatchError, match="no longer matches"):
            with patches.applied():
                pass
    finally:
        patches.unregister_patch(wrong)
    assert masking_utils._ignore_causal_mask_sdpa is original


def test_where_imported_patches_every_module_holding_the_function():
    """A function model modules import by name (llama imports `create_causal_mask` from masking_utils) is
    swapped there too, and restored in every holder."""
    original = masking_utils.create_causal_mask
    assert modeling_llama.create_causal_mask is original

    @patches.register_patch("transformers.masking_utils.create_causal_mask", check_signature=False,
                            where_imported=True)
    def stand_in(*args, **kwargs):
        return None

    try:
        with patches.applied([p for p in patches.active_patches() if p.replacement is stand_in]):
            assert masking_utils.create_causal_mask is stand_in and modeling_llama.create_causal_mask is stand_in
    finally:
        patches.unregister_patch(stand_in)
    assert masking_utils.create_causal_mask is original and modeling_llama.create_causal_mask is original


def test_registration_imports_no_model_module():
    """Signatures are checked when a patch is applied, for the modules in use: importing the exporters
    imports none of the patched model modules (transformers' auto registry is not one: with accelerate and
    torchao installed, transformers 5 imports it itself)."""
    code = ("import sys, optimum_dynamo.exporters; "
            "print(sorted(m for m in sys.modules if m.startswith('transformers.models.') and '.modeling_' in m "
            "and not m.startswith('transformers.models.auto.')))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]"


def test_version_gate_skips_other_versions():
    @patches.register_patch("transformers.masking_utils.nothing_here", versions={"transformers": "<1"})
    def never(x):
        return x

    try:
        assert all(p.replacement is not never for p in patches.active_patches())
    finally:
        patches.unregister_patch(never)


def test_failing_export_restores_everything(checkpoints, tmp_path):
    """A patch that raises mid-export: attributes, pytree registry and output dir are as before."""
    rms_forward = modeling_llama.LlamaRMSNorm.forward
    mask_fn = masking_utils._ignore_causal_mask_sdpa

    @patches.register_patch("transformers.models.llama.modeling_llama.LlamaRMSNorm.forward")
    def broken(self, hidden_states):
        raise RuntimeError("broken on purpose")

    try:
        with pytest.raises(Exception, match="broken on purpose"):
            export_onnx(checkpoints("llama"), tmp_path / "out" / "model", task="text-generation-with-past")
    finally:
        patches.unregister_patch(broken)
    assert modeling_llama.LlamaRMSNorm.forward is rms_forward
    assert masking_utils._ignore_causal_mask_sdpa is mask_fn
    assert DynamicCache not in pytree.SUPPORTED_NODES
    assert not (tmp_path / "out").exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("model_type, replacement, block_of, skip", [
    ("mixtral", "dense_mixtral_moe", lambda layer: layer.block_sparse_moe,
     "transformers >= 5 loads MoE with batched-matmul experts instead"),
    ("gpt_oss", "dense_gpt_oss_experts", lambda layer: layer.mlp,
     "transformers >= 5 loads gpt_oss with batched-matmul experts; < 4.55 has no gpt_oss"),
])
def test_dense_experts_patch_equals_the_routing_loop(model_type, replacement, block_of, skip):
    """Where a dense-experts patch is active (transformers 4), it computes what the original block does."""
    from transformers import AutoModelForCausalLM

    from optimum_dynamo.patches import transformers_moe
    from tiny import tiny_config

    fn = getattr(transformers_moe, replacement)
    patch = next((p for p in patches.active_patches() if p.replacement is fn), None)
    if patch is None:
        pytest.skip(skip)
    torch.manual_seed(0)
    block = block_of(AutoModelForCausalLM.from_config(tiny_config(model_type)).model.layers[0]).eval()
    hidden = torch.randn(3, 5, 32)
    with torch.no_grad():
        expected, expected_routing = block(hidden)
        with patches.applied([patch]):
            got, routing = block(hidden)
    assert torch.equal(routing, expected_routing)
    assert (got - expected).abs().max().item() < 1e-6


@pytest.mark.parametrize("model_type, module", [
    *[(m, "transformers_moe") for m in ("glm4_moe", "ernie4_5_moe", "hunyuan_v1_moe", "phimoe", "dbrx", "aria_text",
                                        "deepseek_v3", "minimax", "qwen3_next")],
    ("llama4_text", "transformers_complex_rope"),
    ("rwkv", "transformers_rwkv"),
    ("mamba2", "transformers_recurrent_mask"), ("falcon_h1", "transformers_mamba"),
    ("git", "transformers_git"),
    ("falcon_h1", "transformers_recurrent_mask"), ("bamba", "transformers_positions"),
])
def test_patches_keep_the_model_s_logits(model_type, module):
    """Patches that rewrite a model's arithmetic for export (dense experts under each block's own routing on
    transformers 4; Llama 4's complex rotary embedding as real pairs), on the whole tiny model of the zoo:
    the logits equal the unpatched model's."""
    import importlib

    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    import zoo

    name = importlib.import_module(f"optimum_dynamo.patches.{module}").__name__
    package = f"transformers.models.{model_type_to_module_name(model_type)}."
    chosen = [p for p in patches.active_patches() if p.replacement.__module__ == name and p.target.startswith(package)]
    if not chosen:
        pytest.skip(f"no {module} patch for {model_type} with this transformers (>= 5: batched-matmul experts)")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(zoo.tiny_config(model_type)).eval()
    chosen = [p for p in chosen if p.in_use()]
    assert chosen, "the model's own module holds the patched code"
    ids = torch.randint(3, 128, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(ids).logits
        with patches.applied(chosen):
            got = model(ids).logits
    assert (got - expected).abs().max().item() < 1e-5


def test_rwkv_single_token_steps_keep_each_row():
    """transformers' RWKV mixes the rows of a batch on a single-token step with a state (the logits come out
    [batch, batch, vocab]); patched, a batch of 2 stepped one token at a time gives the prefill's logits."""
    from transformers import AutoModelForCausalLM

    import zoo

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(zoo.tiny_config("rwkv")).eval()
    ids = torch.randint(3, 128, (2, 5), generator=torch.Generator().manual_seed(0))
    chosen = [p for p in patches.active_patches() if p.target.startswith("transformers.models.rwkv.")]
    with torch.no_grad(), patches.applied(chosen):
        expected, state, steps = model(ids).logits, None, []
        for t in range(ids.shape[1]):
            out = model(input_ids=ids[:, t : t + 1], state=state, use_cache=True)
            state = out.state
            steps.append(out.logits)
    got = torch.cat(steps, dim=1)
    assert got.shape == expected.shape and (got - expected).abs().max().item() < 1e-5


# CI: LED's encoder where its own patch is active (transformers 4), Longformer's below on transformers 5
# (make test-all: both)
@pytest.mark.once("t4")
def test_led_encoder_keeps_the_length_an_axis():
    """LED's encoder (Longformer's attention) branches on whether any token is global and pads to its window only
    when the length needs it. Patched, it equals the original on a padded batch, and the program traced on 2 rows of
    7 tokens (padded to 8) runs 3 rows of 11 (padded to 12) as the original does."""
    import zoo
    from transformers import AutoModel

    chosen = [p for p in patches.active_patches()
              if p.target.startswith("transformers.models.led.modeling_led.LEDEncoder")]
    assert len(chosen) == 4
    config = zoo.tiny_config("led", zoo.TINY_VISION)
    config.attention_window = 4
    torch.manual_seed(0)
    encoder = AutoModel.from_config(config).eval().get_encoder()

    def batch(rows, length):
        mask = torch.ones(rows, length, dtype=torch.long)
        mask[0, length - 3:] = 0  # right padding, as BART-style tokenizers give
        return {"input_ids": torch.randint(3, 64, (rows, length)), "attention_mask": mask}

    inputs = batch(3, 11)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        expected = encoder(**inputs).last_hidden_state
        with patches.applied(chosen):
            assert (encoder(**inputs).last_hidden_state - expected)[real].abs().max().item() < 1e-5
            dynamic = {"input_ids": {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC}}
            dynamic["attention_mask"] = dynamic["input_ids"]
            program = torch.export.export(encoder, (), batch(2, 7), dynamic_shapes=dynamic, strict=False)
        got = program.module()(**inputs).last_hidden_state
    assert got.shape == expected.shape and (got - expected)[real].abs().max().item() < 1e-5


def test_pixtral_whole_images_keep_the_batch_an_axis():
    """Pixtral's vision tower without `image_sizes` crops and packs image by image, a loop over the batch that
    torch.export unrolls. Patched, a batch of 3 gives the original's packed sequence exactly, and the program traced on
    it runs a batch of 5 as the original does."""
    import zoo
    from transformers import AutoModel

    chosen = [p for p in patches.active_patches() if p.target.endswith(".PixtralVisionModel.forward")]
    assert len(chosen) == 1
    torch.manual_seed(0)
    model = AutoModel.from_config(zoo.tiny_config("pixtral", zoo.TINY_VISION)).eval()
    three, five = torch.randn(3, 3, 32, 32), torch.randn(5, 3, 32, 32)
    with torch.no_grad():
        expected = model(three).last_hidden_state
        with patches.applied(chosen):
            assert torch.equal(model(three).last_hidden_state, expected)
            program = torch.export.export(model, (), {"pixel_values": three}, strict=False,
                                          dynamic_shapes={"pixel_values": {0: torch.export.Dim.DYNAMIC}})
        got = program.module()(pixel_values=five).last_hidden_state
        assert got.shape == (1, 5 * 16, model.config.hidden_size)
        assert (got - model(five).last_hidden_state).abs().max().item() < 1e-5


def test_pixtral_block_mask_patch_keeps_the_image_features():
    """Pixtral's block mask from image indices: the mask of several images and the tiny Mistral 3's image
    features (two images of different sizes, padded to one batch) equal the unpatched ones."""
    from transformers import AutoModelForImageTextToText
    from transformers.models.pixtral import modeling_pixtral

    from tiny import tiny_vlm_config

    chosen = [p for p in patches.active_patches() if p.target.startswith("transformers.models.pixtral.")]
    assert chosen, "the block mask patch is active"
    embeds = torch.zeros(1, 14, 8)
    expected = modeling_pixtral.generate_block_attention_mask([4, 6, 4], embeds)
    with patches.applied(chosen):
        assert torch.equal(modeling_pixtral.generate_block_attention_mask([4, 6, 4], embeds), expected)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(tiny_vlm_config("mistral3")).eval()
    pixels, sizes = torch.randn(2, 3, 48, 64), torch.tensor([[48, 64], [32, 32]])
    with torch.no_grad():
        expected = model.model.get_image_features(pixels, sizes)
        with patches.applied(chosen):
            got = model.model.get_image_features(pixels, sizes)
    rows = [getattr(out, "pooler_output", out) for out in (expected, got)]
    assert torch.equal(torch.cat(rows[0]), torch.cat(rows[1]))


def test_git_patch_keeps_padded_generation():
    """GIT's patch takes eager's prefill / decode branch from a tensor: a left-padded `generate` (the prefill
    with its mask, decode steps with eager's) gives the unpatched model's scores."""
    from transformers import AutoModelForCausalLM

    import zoo
    from optimum_dynamo.patches import transformers_git

    chosen = [p for p in patches.active_patches() if p.replacement.__module__ == transformers_git.__name__]
    if not chosen:
        pytest.skip("no GIT patch for this transformers")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(zoo.tiny_config("git")).eval()
    ids = torch.randint(3, 128, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    options = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0, output_scores=True,
                   return_dict_in_generate=True)
    with torch.no_grad():
        expected = model.generate(ids, **options)
        with patches.applied([p for p in chosen if p.in_use()]):
            got = model.generate(ids, **options)
    assert torch.equal(got.sequences, expected.sequences)
    assert (torch.stack(got.scores) - torch.stack(expected.scores)).abs().max().item() < 1e-5


@pytest.mark.parametrize("model_type", ["doge"])
def test_attention_output_copy_keeps_the_logits(model_type):
    """The copy after the attention transpose (transformers 4: indexing the interface; 5: `get_interface`), on a
    model whose SDPA mask is a float one (Doge's dynamic mask) and a left-padded batch: the same logits."""
    from transformers import AutoModelForCausalLM

    import zoo

    chosen = [p for p in patches.active_patches() if p.replacement.__module__.endswith(".transformers_attention")]
    assert chosen
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(zoo.tiny_config(model_type)).eval()
    ids = torch.randint(3, 128, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
        with patches.applied(chosen):
            got = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(got, expected)


def test_zamba2_stepped_prompt_leaves_padding_out_of_the_state():
    """transformers 4's Zamba2 masks padding only on its prompt path: patched, a left-padded prompt stepped one
    token per call from the zero state gives the prefill's last logits (padding tokens that are not the
    padding id, whose embedding would be zero anyway)."""
    from transformers import AutoModelForCausalLM
    from transformers.models.zamba2 import modeling_zamba2

    import zoo
    from optimum_dynamo.capture.stepping import zero_state

    if not hasattr(modeling_zamba2, "Zamba2HybridDynamicCache"):
        pytest.skip("transformers >= 5 masks Zamba2's padding on every path")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(zoo.tiny_config("zamba2")).eval()
    ids = torch.tensor([[7, 3, 5, 9, 17, 23], [4, 8, 15, 16, 23, 42]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits[:, -1]
    with torch.no_grad(), patches.applied():
        cache = zero_state(model, 2)
        for t in range(ids.shape[1]):
            out = model(input_ids=ids[:, t : t + 1], attention_mask=mask[:, : t + 1], past_key_values=cache,
                        use_cache=True, cache_position=torch.tensor([t]))
            cache = out.past_key_values
    assert (out.logits[:, -1] - expected).abs().max().item() < 1e-5


def test_packed_vision_attention_keeps_the_tower_s_output():
    """Qwen2-VL's per-image attention as one masked attention: the tower's rows on two images of different sizes
    are those of transformers' per-image loop."""
    from transformers import AutoModelForImageTextToText

    from optimum_dynamo.patches import transformers_packed_vision
    from tiny import tiny_vlm_config

    active = [p for p in patches.active_patches() if p.target.endswith("VisionAttention.forward")
              and p.replacement.__module__ == transformers_packed_vision.__name__]
    torch.manual_seed(0)
    tower = AutoModelForImageTextToText.from_config(tiny_vlm_config("qwen2_vl")).model.visual.eval()
    grid = torch.tensor([[1, 4, 4], [1, 6, 4]])
    pixels = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 8 * 8)
    with torch.no_grad():
        expected = tower(pixels, grid_thw=grid)
        with patches.applied([p for p in active if ".qwen2_vl." in p.target]) as swapped:
            got = tower(pixels, grid_thw=grid)
    assert len(swapped) == 1
    rows = [out if isinstance(out, torch.Tensor) else out.pooler_output for out in (expected, got)]
    assert (rows[0] - rows[1]).abs().max().item() < 1e-6


@pytest.mark.parametrize("model_type", ["idefics3", "smolvlm"])
def test_vision_positions_patch_keeps_the_model_s_logits(model_type, tmp_path):
    """transformers 4's Idefics3 / SmolVLM patch positions (a loop over the images) computed for all images at
    once: the logits on an image split into tiles, and the embeddings of images padded at the bottom or the
    right, are the unpatched model's."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from optimum_dynamo.exporters.vision_language import default_image
    from optimum_dynamo.patches import transformers_vision_positions
    from tiny import save_tiny_vlm

    chosen = [p for p in patches.active_patches()
              if p.replacement.__module__ == transformers_vision_positions.__name__ and f".{model_type}." in p.target]
    if not chosen:
        pytest.skip("transformers 5 computes the positions of all images at once")
    path = save_tiny_vlm(model_type, tmp_path)
    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    inputs = AutoProcessor.from_pretrained(path)(images=[default_image()], text="the quick <image> brown fox",
                                                return_tensors="pt")
    embeddings = model.model.vision_model.embeddings
    pixels, mask = torch.randn(3, 3, 32, 32), torch.ones(3, 4, 4, dtype=torch.bool)
    mask[1, 3:], mask[2, :, 1:] = False, False
    with torch.no_grad():
        expected = model(**inputs).logits, embeddings(pixels, mask)
        with patches.applied(chosen):
            got = model(**inputs).logits, embeddings(pixels, mask)
    assert inputs["pixel_values"].shape[1] > 1 and all(torch.equal(a, b) for a, b in zip(got, expected))


def test_idefics2_tower_patches_keep_its_output():
    """transformers 4's Idefics2 vision tower with its patch positions computed for all images at once and its patch
    mask always passed: the same rows for whole images (where 4.57 drops the mask) and for images padded at the
    bottom or the right."""
    from transformers import Idefics2Config
    from transformers.models.idefics2 import modeling_idefics2

    from optimum_dynamo.patches import transformers_kept_masks, transformers_vision_positions

    chosen = [p for p in patches.active_patches() if ".idefics2." in p.target and p.replacement.__module__ in
              (transformers_kept_masks.__name__, transformers_vision_positions.__name__)]
    if not chosen:
        pytest.skip("transformers 5's Idefics2 tower has neither the loop over images nor the branch on the mask")
    torch.manual_seed(0)
    config = Idefics2Config(vision_config=dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=2, num_attention_heads=4)).vision_config
    tower = modeling_idefics2.Idefics2VisionTransformer(config).eval()
    pixels, padded = torch.randn(3, 3, 32, 32), torch.ones(3, 4, 4, dtype=torch.bool)
    padded[1, 3:], padded[2, :, 1:] = False, False
    with torch.no_grad():
        expected = [tower(pixels).last_hidden_state, tower(pixels, patch_attention_mask=padded).last_hidden_state]
        with patches.applied(chosen) as swapped:
            got = [tower(pixels).last_hidden_state, tower(pixels, patch_attention_mask=padded).last_hidden_state]
    assert len(swapped) == 2
    for a, b in zip(got, expected):
        assert (a - b).abs().max().item() < 1e-6


def test_deepstack_scatter_patch_adds_exactly_what_the_model_adds():
    """Qwen3-VL's boolean-index add of DeepStack rows as a masked scatter into zeros, added: bit-for-bit the same
    hidden states, whatever the mask (some positions, none, all)."""
    import transformers

    from optimum_dynamo.patches import transformers_deepstack

    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("exercised where Qwen3-VL exports (transformers 5)")
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextModel

    active = [p for p in patches.active_patches() if p.replacement is transformers_deepstack.deepstack_by_scatter
              and p.target.endswith("Qwen3VLTextModel._deepstack_process")]
    torch.manual_seed(0)
    hidden = torch.randn(2, 5, 8)
    for mask in (torch.rand(2, 5) > 0.5, torch.zeros(2, 5, dtype=torch.bool), torch.ones(2, 5, dtype=torch.bool)):
        rows = torch.randn(int(mask.sum()), 8)
        expected = Qwen3VLTextModel._deepstack_process(None, hidden, mask, rows)
        with patches.applied(active) as swapped:
            got = Qwen3VLTextModel._deepstack_process(None, hidden, mask, rows)
        assert len(swapped) == 1 and torch.equal(got, expected)


def test_idefics_attention_patch_keeps_the_model_s_logits():
    """transformers 4's Idefics attention with the past's length read from the cache instead of `cache_position`'s
    value: the prompt's and a decode step's logits are the unpatched model's."""
    from transformers import AutoModelForImageTextToText

    from optimum_dynamo.patches import transformers_idefics

    import zoo

    chosen = [p for p in patches.active_patches() if p.replacement is transformers_idefics.idefics_attention_past_length]
    if not chosen:
        pytest.skip("transformers 5's Idefics attention reads no cache_position")
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(zoo.tiny_config("idefics", zoo.TINY_VISION)).eval()
    ids, pixels = torch.randint(3, 100, (2, 6)), torch.randn(2, 1, 3, 32, 32)
    image_mask = torch.zeros(2, 6, 1, dtype=torch.long)
    image_mask[:, 2:] = 1

    def prompt_and_step():
        out = model(input_ids=ids, pixel_values=pixels, image_attention_mask=image_mask, use_cache=True)
        step = model(input_ids=ids[:, -1:], image_encoder_embeddings=out.image_hidden_states,
                     image_attention_mask=image_mask[:, -1:], past_key_values=out.past_key_values, use_cache=True)
        return out.logits, step.logits

    with torch.no_grad():
        expected = prompt_and_step()
        with patches.applied(chosen) as swapped:
            got = prompt_and_step()
    assert len(swapped) == 1 and all(torch.equal(a, b) for a, b in zip(got, expected))


def test_funnel_positions_for_any_length():
    """Funnel builds its relative positions from the sequence length as Python ints (5.x) or tensor values (4.57):
    torch.export fixes the length. Patched, the model's logits are unchanged at several lengths, and the length
    stays an axis of the exported program (its ONNX graph: the zoo's funnel rows, every length from 5 to 39)."""
    from transformers import FunnelConfig, FunnelForSequenceClassification

    torch.manual_seed(0)
    config = FunnelConfig(vocab_size=64, block_sizes=[1, 1, 1], d_model=32, n_head=4, d_head=8, d_inner=64)
    model = FunnelForSequenceClassification(config).eval()
    chosen = [p for p in patches.active_patches() if p.target.startswith("transformers.models.funnel.")]
    assert chosen
    batches = [torch.randint(3, 64, (2, n), generator=torch.Generator().manual_seed(n)) for n in (6, 9, 14)]
    with torch.no_grad():
        expected = [model(ids).logits for ids in batches]
        with patches.applied(chosen):
            assert all((model(ids).logits - e).abs().max().item() < 1e-5 for ids, e in zip(batches, expected))
            program = torch.export.export(model, (), {"input_ids": batches[1]},
                                          dynamic_shapes={"input_ids": {1: torch.export.Dim.DYNAMIC}}, strict=False)
    length = program.graph_signature.user_inputs[0]
    (node,) = [n for n in program.graph.nodes if n.op == "placeholder" and n.name == length]
    assert isinstance(node.meta["val"].shape[1], torch.SymInt)


@pytest.mark.once("t5")
def test_longformer_local_attention_for_any_length():
    """Longformer asks the mask whether any token is global (`.item()`) and branches on it, chunks by a view whose
    count is a tensor value, and pads to a multiple of the window only if needed: torch.export stops or fixes the
    length. Patched, without a global_attention_mask (the fill-mask and token-classification runtime feeds none), the
    logits are unchanged on a padded batch, and the program (dynamic batch and length) equals eager at another
    length, a multiple of the window where the traced one was not."""
    from transformers import LongformerConfig, LongformerForMaskedLM

    torch.manual_seed(0)
    config = LongformerConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=64, attention_window=[4, 4], max_position_embeddings=64, pad_token_id=1)
    model = LongformerForMaskedLM(config).eval()
    chosen = [p for p in patches.active_patches() if p.target.startswith("transformers.models.longformer.")]
    assert chosen

    def batch(n):
        ids = torch.randint(3, 64, (2, n), generator=torch.Generator().manual_seed(n))
        mask = torch.ones_like(ids)
        mask[1, n - 3:] = 0
        return {"input_ids": ids, "attention_mask": mask}

    batches = [batch(n) for n in (8, 11, 12)]
    dims = {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC}
    with torch.no_grad():
        expected = [model(**b).logits for b in batches]
        with patches.applied(chosen):
            assert all((model(**b).logits - e).abs().max().item() < 1e-5 for b, e in zip(batches[:2], expected))
            program = torch.export.export(model, (), batches[1], dynamic_shapes={k: dims for k in batches[1]},
                                          strict=False)
        got = program.module()(**batches[2]).logits
    assert (got - expected[2]).abs().max().item() < 1e-5


@pytest.mark.skipif(transformers_version >= "5", reason="transformers 5 has no MEGA (removed)")
def test_mega_ema_kernel_for_any_length():
    """MEGA's EMA serves its kernel from a cache in eval mode: exported after an eager run (the CLI's capture), the
    kernel is a constant of that run's length, too short for longer sequences. Patched, the logits are unchanged at
    several lengths, and the program traced at 6 after an eager run at 6 gives eager's logits at 14."""
    from transformers import MegaConfig, MegaForMaskedLM

    torch.manual_seed(0)
    config = MegaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, ema_projection_size=8,
                        shared_representation_size=16, num_hidden_layers=2, max_positions=64)
    model = MegaForMaskedLM(config).eval()
    chosen = [p for p in patches.active_patches() if p.target.startswith("transformers.models.deprecated.mega.")]
    assert chosen
    batches = [torch.randint(3, 64, (2, n), generator=torch.Generator().manual_seed(n)) for n in (6, 9, 14)]
    with torch.no_grad():
        expected = [model(ids).logits for ids in batches]
        for module in model.modules():
            if hasattr(module, "_kernel"):
                module._kernel = None
        model(batches[0])  # the capture: a kernel of length 6 cached
        with patches.applied(chosen):
            assert all((model(ids).logits - e).abs().max().item() < 1e-5 for ids, e in zip(batches, expected))
            program = torch.export.export(model, (), {"input_ids": batches[0]},
                                          dynamic_shapes={"input_ids": {1: torch.export.Dim.DYNAMIC}}, strict=False)
        got = program.module()(input_ids=batches[2]).logits
    assert (got - expected[2]).abs().max().item() < 1e-5


def test_canine_sequence_length_stays_an_axis():
    """CANINE pools its molecule mask with MaxPool1d, loops over local-attention chunks with `range(length)` and
    repeats its molecules by a count from the length: torch.export fixes the length. Patched, the logits are unchanged
    at lengths besides multiples of the downsampling rate, over one chunk or several, a padded row's last chunk
    all padding (an 8-wide chunk here; CANINE's is 128), and the length stays an axis of the exported program."""
    from transformers import CanineConfig, CanineForSequenceClassification

    torch.manual_seed(0)
    config = CanineConfig(hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=2,
                          local_transformer_stride=8, max_position_embeddings=64, num_hash_buckets=64)
    model = CanineForSequenceClassification(config).eval()
    chosen = [p for p in patches.active_patches() if p.target.startswith("transformers.models.canine.")]
    assert len(chosen) == 3

    def batch(n):
        mask = torch.ones(2, n, dtype=torch.long)
        mask[1, n * 2 // 3:] = 0
        return {"input_ids": torch.randint(3, 5000, (2, n), generator=torch.Generator().manual_seed(n)),
                "attention_mask": mask}

    lengths = (6, 13, 8, 30, 47)
    with torch.no_grad():
        expected = [model(**batch(n)).logits for n in lengths]
        with patches.applied(chosen):
            assert all((model(**batch(n)).logits - e).abs().max().item() < 1e-5 for n, e in zip(lengths, expected))
            axis = {1: torch.export.Dim.DYNAMIC}
            program = torch.export.export(model, (), batch(13), strict=False,
                                          dynamic_shapes={"input_ids": axis, "attention_mask": axis})
    ids = program.graph_signature.user_inputs[0]
    (node,) = [n for n in program.graph.nodes if n.op == "placeholder" and n.name == ids]
    assert isinstance(node.meta["val"].shape[1], torch.SymInt)
    assert all((program.module()(**batch(n)).logits - e).abs().max().item() < 1e-5  # (its guards: from 8 on, two
               for n, e in zip(lengths[2:], expected[2:]))  # molecules as traced; the ONNX graph takes 4 to 7 too)


def test_moonshine_encoder_exports_for_any_clip_length():
    """Moonshine's encoder length patch: torch.export keeps the clip length dynamic (unpatched, it is specialized
    to the traced length), and the program at another length, a row padded, equals eager."""
    import zoo
    from transformers import AutoModelForSpeechSeq2Seq

    chosen = [p for p in patches.active_patches() if p.target.startswith("transformers.models.moonshine.")]
    assert chosen, "the length patch is active"
    torch.manual_seed(0)
    config = zoo.tiny_config("moonshine", zoo.TINY_AUDIO, stages=True)  # the zoo's (transformers 4.57's encoder
    # reads some of the decoder's sizes, which tiny.py's config sets apart)
    encoder = AutoModelForSpeechSeq2Seq.from_config(config).eval().get_encoder()

    def clips(length):
        mask = torch.ones(2, length, dtype=torch.long)
        mask[1, length * 3 // 4:] = 0
        return {"input_values": torch.randn(2, length), "attention_mask": mask}

    shapes = {name: {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC} for name in clips(8000)}  # as the
    # export's (torch 2.13 fails to trace the attention's reshape at a static batch)
    with patches.applied():  # the export's patches (transformers 4.57's masks too), this one among them
        program = torch.export.export(encoder, (), clips(8000), dynamic_shapes=shapes, strict=False)
    inputs = clips(13000)
    with torch.no_grad():
        expected = encoder(**inputs).last_hidden_state
    got = program.module()(**inputs).last_hidden_state
    assert got.shape == expected.shape and (got - expected).abs().max().item() < 1e-5


def test_wavlm_attention_in_parts_translates_at_any_clip_length(tmp_path):
    """WavLM's attention through `F.multi_head_attention_forward`: torch 2.13's ONNX decomposition cannot view its
    output at a dynamic length. Patched, the model equals the original (a row padded), and its ONNX graph, traced at
    one clip length, runs another in onnxruntime as PyTorch does (1e-4)."""
    import onnxruntime as ort
    import zoo
    from transformers import AutoModelForAudioClassification

    chosen = [p for p in patches.active_patches() if p.replacement.__module__.endswith(".transformers_wavlm")]
    if not chosen:
        pytest.skip(f"torch {torch.__version__} decomposes the attention itself: the patch is for torch < 2.15")
    torch.manual_seed(0)
    model = AutoModelForAudioClassification.from_config(zoo.tiny_config("wavlm", zoo.TINY_AUDIO, stages=True)).eval()

    def clips(length):
        mask = torch.ones(2, length, dtype=torch.long)
        mask[1, length * 3 // 4:] = 0
        return {"input_values": torch.randn(2, length), "attention_mask": mask}

    inputs = clips(9000)
    with torch.no_grad():
        expected = model(**inputs).logits
        with patches.applied(chosen):
            assert (model(**inputs).logits - expected).abs().max().item() < 1e-5
            shapes = {name: {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC} for name in inputs}
            program = torch.export.export(model, (), clips(16000), dynamic_shapes=shapes, strict=False)
    torch.onnx.export(program, (), str(tmp_path / "wavlm.onnx"), dynamo=True)
    session = ort.InferenceSession(str(tmp_path / "wavlm.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {name: value.numpy() for name, value in inputs.items()})[0]
    assert abs(got - expected.numpy()).max() < 1e-4


@pytest.mark.parametrize("model_type", ["wav2vec2", "wav2vec2-bert"])
def test_xvector_pooling_of_a_masked_batch_exports_for_any_batch(model_type):
    """Given a mask, the x-vector heads pool each row up to its length in a loop over the rows: torch.export fixes
    the batch. Patched, the embeddings and logits equal the original's on a padded batch, and the program traced on
    two clips runs three of other lengths as eager does."""
    import zoo
    from transformers import AutoModelForAudioXVector

    torch.manual_seed(0)
    model = AutoModelForAudioXVector.from_config(zoo.tiny_config(model_type, zoo.TINY_AUDIO, stages=True)).eval()
    main = "input_features" if model_type == "wav2vec2-bert" else "input_values"

    def clips(batch, length):
        mask = torch.ones(batch, length, dtype=torch.long)
        mask[1, length * 2 // 3:] = 0
        shape = (batch, length, model.config.feature_projection_input_dim) if main == "input_features" else (
            batch, length)
        return {main: torch.randn(shape), "attention_mask": mask}

    chosen = [p for p in patches.active_patches() if p.replacement.__module__.endswith("transformers_xvector")
              and p.target.startswith(type(model).__module__)]
    assert chosen
    inputs = clips(3, 120 if main == "input_features" else 9000)
    with torch.no_grad():
        expected = model(**inputs)
        with patches.applied(chosen):
            got = model(**inputs)
            assert all((got[k] - expected[k]).abs().max().item() < 1e-5 for k in ("logits", "embeddings"))
            shapes = {name: {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC} for name in inputs}
            program = torch.export.export(model, (), clips(2, 100 if main == "input_features" else 8000),
                                          dynamic_shapes=shapes, strict=False)
    assert (program.module()(**inputs).embeddings - expected.embeddings).abs().max().item() < 1e-5


@pytest.mark.skipif(transformers_version < "5", reason="transformers 4.57's DINOv2 with registers also checks "
                    "int(height) itself (the export is refused in one line)")
def test_torch_int_keeps_an_image_size_symbolic():
    """DINOv2 with registers interpolates its position embeddings to `torch_int(height)` patches: patched, the
    program traced at 80x80 runs 48x48 images as eager does (unpatched, the 80x80 grid is in the graph)."""
    import zoo
    from transformers import AutoModelForImageClassification
    from transformers.models.dinov2_with_registers import modeling_dinov2_with_registers as modeling

    torch.manual_seed(0)
    config = zoo.tiny_config("dinov2_with_registers", dict(zoo.TINY_VISION, image_size=64), stages=True)
    model = AutoModelForImageClassification.from_config(config).eval()
    dynamic = {"pixel_values": {0: torch.export.Dim.DYNAMIC, 2: torch.export.Dim.DYNAMIC, 3: torch.export.Dim.DYNAMIC}}
    unpatched = modeling.torch_int
    with patches.applied():
        assert modeling.torch_int is not unpatched  # swapped where the modeling module imported it
        program = torch.export.export(model, (), {"pixel_values": torch.randn(3, 3, 80, 80)}, dynamic_shapes=dynamic,
                                      strict=False)
    assert modeling.torch_int is unpatched
    images = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        expected = model(pixel_values=images).logits
    got = program.module()(pixel_values=images).logits
    assert (got - expected).abs().max().item() < 1e-5


@pytest.mark.skipif(transformers_version >= "5", reason="transformers 5's classifiers export as they are")
@pytest.mark.parametrize("model_type, extra", [("bart", {}), ("bigbird_pegasus", {"attention_type": "original_full"})])
def test_eos_pooling_exports_and_matches_the_original(model_type, extra):
    """BART's classifier on transformers 4 pools at each row's last eos by a boolean index: patched, the program
    traced on one batch matches the unpatched model on another (other lengths, eos before the padding).
    BigBird-Pegasus's decoder, given no mask, also needs `decoder_mask_of_ones` (its eager attention)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1,
                                  encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                  decoder_ffn_dim=64, max_position_embeddings=64, eos_token_id=2, pad_token_id=1,
                                  num_labels=3, use_cache=False, **extra)
    model = AutoModelForSequenceClassification.from_config(config).eval()

    def batch(lengths, total):
        ids = torch.full((len(lengths), total), config.pad_token_id)
        for row, n in enumerate(lengths):
            ids[row, :n - 1] = torch.randint(4, 64, (n - 1,))
            ids[row, n - 1] = config.eos_token_id
        return {"input_ids": ids, "attention_mask": (ids != config.pad_token_id).long()}

    shapes = {name: {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC} for name in ("input_ids", "attention_mask")}
    with patches.applied():
        program = torch.export.export(model, (), batch([5, 3], 6), dynamic_shapes=shapes, strict=False)
    inputs = batch([9, 4, 7], 9)
    with torch.no_grad():
        expected = model(**inputs).logits
    got = program.module()(**inputs).logits
    assert (got - expected).abs().max().item() < 1e-5


class _FeatureGrid(torch.nn.Module):
    """A detector's bookkeeping (Deformable DETR's): its feature maps' sizes as a tensor, a point per pixel."""

    def forward(self, features):
        shapes = torch.as_tensor([(features.shape[2], features.shape[3]), (features.shape[2] // 2, features.shape[3] // 2)],
                                 dtype=torch.long)
        ys = torch.linspace(0.5, features.shape[2] - 0.5, features.shape[2], dtype=features.dtype)
        return features.flatten(2).sum(-1) * shapes.prod(1).sum() + ys.sum()


def test_tensors_of_sizes_stay_symbolic():
    """`torch.as_tensor` of sizes and `torch.linspace` over a size: patched, the program traced at 12x10 computes
    8x14 as eager does (unpatched, the traced sizes are in the graph)."""
    model = _FeatureGrid()
    dynamic = {"features": {2: torch.export.Dim.DYNAMIC, 3: torch.export.Dim.DYNAMIC}}
    with patches.applied():
        program = torch.export.export(model, (), {"features": torch.randn(1, 2, 12, 10)}, dynamic_shapes=dynamic,
                                      strict=False)
    features = torch.randn(1, 2, 8, 14)
    assert torch.allclose(program.module()(features=features), model(features), atol=1e-5)
    assert torch.linspace(0.5, 7.5, 8).tolist() == [0.5 + i for i in range(8)]  # restored: the original's values


@pytest.mark.parametrize("version", [pytest.param("v1", marks=pytest.mark.once("t4")),
                                     pytest.param("v2", marks=pytest.mark.once("t5"))])
def test_tf_padding_takes_any_image_size(version):
    """MobileNet's TensorFlow-style padding: patched, the program traced at 80x80 runs an odd 67x71 image as eager
    does (unpatched, torch.export fixes the image size)."""
    import transformers

    torch.manual_seed(0)
    prefix = "MobileNetV1" if version == "v1" else "MobileNetV2"
    config = getattr(transformers, f"{prefix}Config")(depth_multiplier=0.25, min_depth=4, image_size=64, num_labels=3)
    model = getattr(transformers, f"{prefix}ForImageClassification")(config).eval()
    dynamic = {"pixel_values": {0: torch.export.Dim.DYNAMIC, 2: torch.export.Dim.DYNAMIC, 3: torch.export.Dim.DYNAMIC}}
    with patches.applied():
        program = torch.export.export(model, (), {"pixel_values": torch.randn(2, 3, 80, 80)}, dynamic_shapes=dynamic,
                                      strict=False)
    images = torch.randn(3, 3, 67, 71)
    with torch.no_grad():
        expected = model(pixel_values=images).logits
    assert (program.module()(pixel_values=images).logits - expected).abs().max().item() < 1e-5


@pytest.mark.skipif(not hasattr(__import__("transformers"), "Qwen3ASRForConditionalGeneration"),
                    reason="Qwen3-ASR is new in transformers 5.24")
def test_packed_audio_windows_export_and_match_the_original():
    """Qwen3-ASR's tower attends within windows of its packed clips (bounds from `.item()` and a loop, windows
    split by `.tolist()`): patched, a program traced on two clips gives the original's features on three others,
    with windows of 13 rows so that a clip spans several."""
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    torch.manual_seed(0)
    audio = dict(model_type="qwen3_asr_encoder", d_model=32, encoder_ffn_dim=64, encoder_layers=2, num_mel_bins=16,
                 encoder_attention_heads=4, output_dim=32, downsample_hidden_size=8, n_window_infer=100)
    text = dict(model_type="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=4, num_key_value_heads=2)
    model = AutoModelForSeq2SeqLM.from_config(AutoConfig.for_model("qwen3_asr", audio_config=audio, text_config=text,
                                                                     audio_token_id=5, timestamp_token_id=6)).eval()

    def clips(*frames):  # mel features padded to whole chunks of 100 frames, each clip's mask
        width = -(-max(frames) // 100) * 100
        mask = torch.stack([torch.arange(width) < n for n in frames]).long()
        return {"input_features": torch.randn(len(frames), 16, width) * mask[:, None], "input_features_mask": mask}

    class Features(torch.nn.Module):
        def forward(self, input_features, input_features_mask):
            return model.get_audio_features(input_features, input_features_mask).pooler_output

    dynamic = {"input_features": {0: torch.export.Dim.DYNAMIC, 2: torch.export.Dim.DYNAMIC},
               "input_features_mask": {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC}}
    with patches.applied(), torch.no_grad():
        program = torch.export.export(Features(), (), clips(230, 140), dynamic_shapes=dynamic, strict=False)
    other = clips(310, 90, 205)
    with torch.no_grad():
        expected = Features()(**other)
    got = program.module()(**other)
    assert got.shape == expected.shape and (got - expected).abs().max().item() < 1e-5


_SCAN_IN_MIXERS = pytest.mark.skipif(transformers_version < "5.15",
                                     reason="transformers 4 writes the scan inside each mixer's forward")


@pytest.mark.parametrize("model_type,function", [
    pytest.param("mamba", "mamba_selective_scan", marks=_SCAN_IN_MIXERS),
    pytest.param("zamba", "mamba_selective_scan", marks=[_SCAN_IN_MIXERS, pytest.mark.slow]),
    pytest.param("rwkv", "rwkv_linear_attention_cpu", marks=pytest.mark.once("t4")),
])
def test_selective_scan_keeps_the_length_an_axis(model_type, function, tmp_path):
    """The Mamba-1 selective scan and RWKV's WKV recurrence loop over the length in Python: torch.export unrolls
    them at the traced length. Patched (`torch.scan`), the model equals the original on a padded batch, and its ONNX
    graph, traced on two rows of 7 tokens, runs three rows of 11 in onnxruntime as PyTorch does (1e-4)."""
    import onnxruntime as ort
    import zoo
    from transformers import AutoModel

    torch.manual_seed(0)
    model = AutoModel.from_config(zoo.tiny_config(model_type)).eval()
    chosen = [p for p in patches.active_patches() if p.target == f"{type(model).__module__}.{function}"]
    assert len(chosen) == 1

    def batch(rows, length):
        mask = torch.ones(rows, length, dtype=torch.long)
        mask[0, :length // 3] = 0  # left padding, as the tokenizers of decoders give
        return {"input_ids": torch.randint(3, 64, (rows, length)), "attention_mask": mask}

    inputs = batch(3, 11)
    with torch.no_grad():
        expected = model(**inputs, use_cache=False).last_hidden_state
        with patches.applied(chosen):
            assert (model(**inputs, use_cache=False).last_hidden_state - expected).abs().max().item() < 1e-5
            shapes = {"input_ids": {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC}, "use_cache": None}
            shapes["attention_mask"] = shapes["input_ids"]
            program = torch.export.export(model, (), {**batch(2, 7), "use_cache": False}, dynamic_shapes=shapes,
                                          strict=False)
    torch.onnx.export(program, (), str(tmp_path / "scan.onnx"), dynamo=True)
    session = ort.InferenceSession(str(tmp_path / "scan.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {name: value.numpy() for name, value in inputs.items()})[0]
    assert abs(got - expected.numpy()).max() < 1e-4
