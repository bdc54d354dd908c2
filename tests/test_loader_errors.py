"""Bad checkpoints give a CheckpointError that names the file, the tensor, what was expected and what was found."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest
import torch

from deltaserve.weights import CheckpointError, load_checkpoint
from model_helpers import make_hf_model
from test_loader import LM, fused_tensors, hf_config, per_expert_tensors, write_checkpoint

QKV = LM + "layers.0.linear_attn.in_proj_qkv.weight"


@pytest.fixture(scope="module")
def moe_base():
    hf = make_hf_model(moe=True, seed=4)
    # Only the language model: keeps the files small and the messages about the tensor under test.
    tensors = {k: v for k, v in fused_tensors(hf).items() if not k.startswith("model.visual.")}
    return hf_config(hf), tensors


@pytest.fixture
def moe(moe_base):
    """(config dict, tensors) fresh for each test, which may edit both."""
    config, tensors = moe_base
    return json.loads(json.dumps(config)), dict(tensors)


def load_error(path: Path) -> str:
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path, progress=False)
    return str(e.value)


def shard_of(path: Path, tensor: str) -> Path:
    return path / json.loads((path / "model.safetensors.index.json").read_text())["weight_map"][tensor]


# ---- mapping and plan errors ---------------------------------------------------------------------------------------


def test_missing_tensor(moe, tmp_path):
    config, tensors = moe
    shape = list(tensors[QKV].shape)
    del tensors[QKV]
    msg = load_error(write_checkpoint(tmp_path, config, tensors, shards=2))
    assert f"missing tensor {QKV}" in msg
    assert f"expected shape {shape}" in msg and "found absent" in msg and str(tmp_path) in msg


def test_missing_one_expert_of_a_per_expert_layout(moe, tmp_path):
    config, tensors = moe
    per = per_expert_tensors(tensors)
    del per[LM + "layers.2.mlp.experts.5.up_proj.weight"]
    msg = load_error(write_checkpoint(tmp_path, config, per))
    assert "layers.2.mlp.experts.gate_up_proj" in msg and "per expert" in msg
    gate_up = tensors[LM + "layers.2.mlp.experts.gate_up_proj"]
    e, two_i, h = gate_up.shape
    assert f"only {gate_up.numel() - two_i // 2 * h} of {gate_up.numel()} elements present" in msg
    assert f"incomplete at index [5] of {e}" in msg  # names the expert


def test_wrong_shape(moe, tmp_path):
    config, tensors = moe
    good = list(tensors[QKV].shape)
    tensors[QKV] = torch.zeros(good[0] - 1, good[1])
    path = write_checkpoint(tmp_path, config, tensors, shards=3)
    msg = load_error(path)
    assert msg.startswith(str(shard_of(path, QKV)))
    assert f"tensor '{QKV}'" in msg and f"shape {[good[0] - 1, good[1]]}, expected {good}" in msg


def test_wrong_shape_of_one_per_expert_slice(moe, tmp_path):
    config, tensors = moe
    per = per_expert_tensors(tensors)
    name = LM + "layers.1.mlp.experts.3.down_proj.weight"
    h, i = per[name].shape
    per[name] = torch.zeros(h, i + 1)
    msg = load_error(write_checkpoint(tmp_path, config, per))
    assert f"tensor '{name}': shape {[h, i + 1]}, expected {[h, i]}" in msg
    assert "parameter 'layers.1.mlp.experts.down_proj' at index [3]" in msg


@pytest.mark.parametrize("dtype,label", [(torch.int32, "I32"), (torch.float64, "F64"), (torch.uint8, "U8")])
def test_wrong_dtype(moe, tmp_path, dtype, label):
    config, tensors = moe
    name = LM + "layers.3.self_attn.q_proj.weight"
    tensors[name] = torch.zeros(tensors[name].shape, dtype=dtype)
    msg = load_error(write_checkpoint(tmp_path, config, tensors))
    assert f"model.safetensors: tensor '{name}' has dtype {label}, expected one of BF16, F16, F32" in msg
    assert "layers.3.self_attn.q_proj.weight" in msg


def test_unexpected_tensor(moe, tmp_path):
    config, tensors = moe
    tensors[LM + "layers.0.linear_attn.bias"] = torch.zeros(4)
    msg = load_error(write_checkpoint(tmp_path, config, tensors))
    assert "model.safetensors: tensor 'model.language_model.layers.0.linear_attn.bias': unexpected tensor" in msg
    assert "parameter 'layers.0.linear_attn.bias', which this model does not have" in msg
    tensors.pop(LM + "layers.0.linear_attn.bias")
    tensors["transformer.wte.weight"] = torch.zeros(4, 4)
    msg = load_error(write_checkpoint(tmp_path, config, tensors))
    assert "unexpected tensor 'transformer.wte.weight' (F32 [4, 4])" in msg


def test_layer_or_expert_beyond_the_config(moe, tmp_path):
    config, tensors = moe
    per = per_expert_tensors(tensors)
    h = config["text_config"]["hidden_size"]
    per[LM + "layers.0.mlp.experts.8.down_proj.weight"] = torch.zeros(h, 32)  # 8 experts: ids 0..7
    msg = load_error(write_checkpoint(tmp_path / "e", config, per))
    assert "maps to index [8] of parameter 'layers.0.mlp.experts.down_proj' whose shape is [8, 64, 32]" in msg
    tensors[LM + "layers.4.input_layernorm.weight"] = torch.zeros(h)  # 4 layers: 0..3
    msg = load_error(write_checkpoint(tmp_path / "l", config, tensors))
    assert "unexpected tensor (it would fill parameter 'layers.4.input_layernorm.weight', which" in msg


def test_fused_and_per_expert_copies_overlap(moe, tmp_path):
    config, tensors = moe
    both = {**per_expert_tensors(tensors), LM + "layers.0.mlp.experts.down_proj": tensors[LM + "layers.0.mlp.experts.down_proj"]}
    msg = load_error(write_checkpoint(tmp_path, config, both))
    assert "overlaps other tensors filling parameter 'layers.0.mlp.experts.down_proj'" in msg


def test_duplicate_tensor_in_two_unindexed_shards(moe, tmp_path):
    config, tensors = moe
    write_checkpoint(tmp_path, config, tensors)
    (tmp_path / "model.safetensors").rename(tmp_path / "a.safetensors")
    from safetensors.torch import save_file

    save_file({QKV: tensors[QKV]}, str(tmp_path / "b.safetensors"))
    msg = load_error(tmp_path)
    assert f"b.safetensors: tensor '{QKV}' is also in {tmp_path / 'a.safetensors'}" in msg


def test_qwen3_next_fused_projection_of_the_wrong_size(tmp_path):
    from test_loader import make_hf_next

    hf = make_hf_next()
    tensors = dict(hf.state_dict())
    name = "model.layers.0.linear_attn.in_proj_qkvz.weight"
    rows, h = tensors[name].shape
    tensors[name] = torch.zeros(rows - 2, h)
    msg = load_error(write_checkpoint(tmp_path, hf_config(hf), tensors))
    assert f"tensor '{name}': shape {[rows - 2, h]} does not fit group-interleaved in_proj_qkvz" in msg
    assert f"expected {rows} rows" in msg and f"found {rows - 2}" in msg


# ---- file and header errors ----------------------------------------------------------------------------------------


def test_truncated_shard(moe, tmp_path):
    config, tensors = moe
    path = write_checkpoint(tmp_path, config, tensors, shards=3)
    shard = shard_of(path, QKV)
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    msg = load_error(path)
    assert msg.startswith(f"{shard}: tensor '") and "truncated shard" in msg
    assert re.search(r"data ends at byte \d+ of the data section, but the file holds only \d+ data bytes", msg)


def test_truncated_inside_the_header(moe, tmp_path):
    config, tensors = moe
    path = write_checkpoint(tmp_path, config, tensors)
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[:200])
    msg = load_error(path)
    assert f"{path / 'model.safetensors'}: header length" in msg and "beyond the file size 200 bytes" in msg


def test_corrupt_header_json(moe, tmp_path):
    config, tensors = moe
    path = write_checkpoint(tmp_path, config, tensors)
    data = bytearray((path / "model.safetensors").read_bytes())
    data[8:12] = b"@#!?"  # the header's first bytes
    (path / "model.safetensors").write_bytes(bytes(data))
    msg = load_error(path)
    assert f"{path / 'model.safetensors'}: header is not valid JSON" in msg


def test_header_offsets_disagree_with_shape(moe, tmp_path):
    config, tensors = moe
    path = write_checkpoint(tmp_path, config, tensors)
    file = path / "model.safetensors"
    data = file.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header[QKV]["shape"] = [header[QKV]["shape"][0] * 2, header[QKV]["shape"][1]]
    raw = json.dumps(header, separators=(",", ":")).encode().ljust(n)  # same or shorter: pad with spaces
    assert len(raw) == n
    file.write_bytes(data[:8] + raw + data[8 + n :])
    msg = load_error(path)
    assert f"{file}: tensor '{QKV}': data_offsets" in msg and "expected" in msg and "F32" in msg


def test_index_names_a_missing_shard(moe, tmp_path):
    config, tensors = moe
    path = write_checkpoint(tmp_path, config, tensors, shards=3)
    shard = shard_of(path, QKV)
    shard.unlink()
    msg = load_error(path)
    assert f"model.safetensors.index.json: names shard '{shard.name}'" in msg and "which does not exist" in msg
    assert "for tensor '" in msg


def test_index_names_a_tensor_not_in_its_shard(moe, tmp_path):
    config, tensors = moe
    path = write_checkpoint(tmp_path, config, tensors, shards=3)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    other = next(f for f in set(index["weight_map"].values()) if f != index["weight_map"][QKV])
    index["weight_map"][QKV] = other
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    msg = load_error(path)
    assert f"says tensor '{QKV}' is in {path / other}, whose header has no such tensor" in msg


def test_unknown_model_type(moe, tmp_path):
    config, tensors = moe
    path = write_checkpoint(tmp_path, {**config, "model_type": "llama"}, tensors)
    msg = load_error(path)
    assert f"{path / 'config.json'}: unknown model_type 'llama'" in msg and "qwen3_5_moe" in msg


def test_not_a_checkpoint(tmp_path):
    assert "no config.json found" in load_error(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(hf_config(make_hf_model(moe=False))))
    assert f"{tmp_path}: no *.safetensors files" in load_error(tmp_path)
