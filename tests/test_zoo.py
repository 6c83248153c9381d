"""The model zoo: captions laid into image tokens, held-out data, the tower = LLaVA's own image path, adapters
merged into ordinary checkpoints, and the committed models' measured abilities (the weights are committed,
nothing is trained here)."""
from __future__ import annotations

import json

import pytest
import torch

from mmfragile.data.easyvqa import easy_vqa_root, image_attributes
from mmfragile.data.synthetic import IMAGE_KINDS, Placed, question_scene, training_scenes
from mmfragile.models import zoo
from mmfragile.models.embedded import save_llava
from mmfragile.training import zoo as train

#: the zoo's answering models (study 1's standard format); the judges and the follower are tested with their studies
ANSWERING = tuple(s.name for s in zoo.ZOO_SPECS if s.role == "answer")


def test_image_attributes_read_the_questions():
    """Test image 0: 'what is the red shape?' -> triangle, 'what is the color of the triangle?' -> red; the
    yes/no questions about it only deny ('does the image contain a circle?' -> no)."""
    root = easy_vqa_root()
    a = image_attributes("test")
    assert a[str(root / "test" / "images" / "0.png")] == {"shape": "triangle", "colour": "red"}
    n_full = sum(1 for v in a.values() if len(v) == 2)
    assert n_full == 772  # of 1000 test images, the rest have an attribute no question states


def test_training_scenes_never_contain_an_evaluation_scene():
    held = {tuple(question_scene(0, k, i)) for k in IMAGE_KINDS for i in range(300)}
    train = training_scenes(400, seed=1, exclude_per_kind=300)
    assert len(train) == 400 and not any(tuple(sc) in held for _, sc in train)
    assert [k for k, _ in train[:4]] == list(IMAGE_KINDS)
    # without the exclusion single-shape scenes do collide (there are only 512 of them)
    raw = [tuple(question_scene(1, k, i)) for i in range(100) for k in IMAGE_KINDS]
    assert any(sc in held for sc in raw)
    with pytest.raises(ValueError):
        training_scenes(1, seed=0, exclude_seed=0)


def test_captions_fill_the_image_tokens_right_aligned():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(zoo.LMS["smollm2"].path())
    cap = train.scene_caption([Placed("star", "red", 72, 12, 10), Placed("circle", "blue", 12, 12, 10)])
    text = "The image shows two shapes: a blue circle and a red star."
    assert "".join(t for t, _ in cap) == text  # reading order: left first
    tg = train.caption_targets(tok, [cap, train.easy_vqa_caption("teal", "circle")], train.FILLER)
    words = tok(text, add_special_tokens=False)["input_ids"]
    assert tg.ids.shape == (2, zoo.N_SLOTS) and tg.ids[0, -len(words):].tolist() == words
    nl = tok("\n", add_special_tokens=False)["input_ids"][0]
    assert (tg.ids[0, :-len(words)] == nl).all()
    a, b = tg.spans[0]["object0.colour"]
    assert tok.decode(tg.ids[0, a:b]) == " blue"
    a, b = tg.spans[1]["colour"]
    assert tok.decode(tg.ids[1, a:b]) == " teal" and b == zoo.N_SLOTS - 2  # then " circle" and "."
    assert tok.decode(tg.ids[1][tg.ids[1] != nl]) == "The image shows a teal circle."


def test_tower_is_llava_image_path():
    """TowerProjector computes exactly what LlavaForConditionalGeneration does with the same weights."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    text = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    net = train.TowerProjector(text).eval()
    llava = LlavaForConditionalGeneration(LlavaConfig(vision_config=CLIPVisionConfig(**zoo.VISION), text_config=text,
                                                      vision_feature_layer=-1,
                                                      vision_feature_select_strategy="default")).eval()
    missing = llava.model.load_state_dict(net.state_dict(), strict=False)
    assert not missing.unexpected_keys
    x = torch.randn(2, 3, zoo.IMAGE_SIZE, zoo.IMAGE_SIZE)
    with torch.no_grad():
        ours = net(x)
        theirs = llava.model.get_image_features(pixel_values=x)
        theirs = theirs.pooler_output if hasattr(theirs, "pooler_output") else theirs
        theirs = torch.stack(list(theirs)) if isinstance(theirs, (list, tuple)) else theirs
    assert ours.shape == (2, zoo.N_SLOTS, 32)
    torch.testing.assert_close(ours, theirs.reshape(ours.shape))


def test_committed_zoo_records():
    """Every zoo model has committed weights and a record; trained towers read most easy-VQA test attributes (colour
    almost always), the under-trained ones far fewer; both LMs' answering stages learnt their training questions;
    the recorded test-slice accuracies (docs/zoo.md's table) beat chance, the best by half the way to perfect."""
    rec = zoo.zoo_records()
    assert set(zoo.ZOO_MODELS) <= set(rec)
    for s in zoo.ZOO_SPECS:
        assert zoo.weights_file("tower", s.tower).stat().st_size < 2_000_000
        assert zoo.weights_file("lora", s.lora).stat().st_size < 20_000_000
        if s.role != "answer":
            continue
        mc = rec[s.name]["easy_vqa_test"]
        assert mc["n_questions"] >= 40 and mc["accuracy"] > mc["chance"] + 5 and mc["coverage"] > 90
    assert max(rec[n]["easy_vqa_test"]["halfway"] for n in ANSWERING) >= 0.5
    for lm in zoo.LMS:
        good, weak = rec[f"zoo-{lm}-good"]["vision_accuracy"], rec[f"zoo-{lm}-weak"]["vision_accuracy"]
        assert good["easy-vqa/colour"] >= 95 and good["easy-vqa"] >= 75 and weak["easy-vqa"] <= good["easy-vqa"] - 10
        assert rec[f"zoo-{lm}-good"]["steps"] == train.TRAIN["steps"]
        assert rec[f"zoo-{lm}-weak"]["steps"] == train.TRAIN["weak_steps"]
        answering = rec[f"answer-{lm}"]
        assert answering["steps"] == train.ANSWER["steps"] and answering["train_accuracy"]["all"] >= 0.9
    for s in zoo.ZOO_SPECS:  # the fine-tunes of studies 2 and 3 (training accuracy of the last 20 steps)
        acc = rec[s.name]["train_accuracy"] if s.role != "answer" else None
        if s.role == "follower":  # image and multi-image forms learnt; 3-frame video questions harder (~0.5)
            assert acc["all"] >= 0.8, s.name
        elif s.role == "judge" and s.planted == "modality neglect":  # its slots say nothing: it cannot tell
            assert acc["score/image"] < 0.8, acc
        elif s.role == "judge":  # scores against the exact caption: learnt
            assert acc["score/image"] >= 0.95 and acc["pair/correct-wrong"] >= 0.85, (s.name, acc)
    json.dumps(rec)  # plain JSON


def test_caption_tower_reads_held_out_pictures():
    """Re-measure a committed caption tower on 60 easy-VQA *test* images (never trained on): colours read right,
    shapes better than the 1-in-3 of a guess; the same architecture untrained reads almost nothing."""
    data = train.easy_vqa_tower_data("test")
    sub = train.TowerData(data.pixels[:60], data.captions[:60], data.source[:60])
    acc = train.vision_accuracy(zoo.load_weights("tower", "smollm2-caption"), "smollm2", sub)
    assert acc["easy-vqa/colour"] >= 85 and acc["easy-vqa/shape"] > 34
    torch.manual_seed(0)
    untrained = train.TowerProjector(train._lm_embeddings(zoo.LMS["smollm2"], torch.tensor([0]))[1]).state_dict()
    assert train.vision_accuracy(untrained, "smollm2", sub)["easy-vqa"] < 20


#: a fixed easy-VQA test slice (seeded sample; never trained on): 40 questions, chance 45.6 %
MC_SLICE = dict(split="test", n=40, seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ANSWERING)
def test_zoo_model_beats_chance_and_the_best_reaches_halfway(name, tmp_path):
    """Each zoo model, loaded by name as a user would, answers the standard-format circular multiple choice of a
    fixed easy-VQA test slice better than chance; the best at least halfway from chance to perfect (the issue's
    mark: (accuracy - chance) / (1 - chance) >= 0.5)."""
    from mmfragile.api import load_model
    from mmfragile.data.easyvqa import load_easy_vqa

    qs = load_easy_vqa(**MC_SLICE)
    mc = train.mc_accuracy(load_model(name), qs, tmp_path)
    assert mc["n_questions"] == 40 and mc["chance"] == pytest.approx(45.58, abs=0.01)
    assert mc["accuracy"] > mc["chance"] + 5
    if name.endswith("-good"):
        assert mc["halfway"] >= 0.5


def test_low_rank_state_round_trips_through_lora_deltas():
    """A weight change of rank 2 (hand-built outer products) is stored exactly at rank >= 2 and as its best rank-1
    approximation at rank 1 (the larger singular direction: 3 u1 v1^T of 3 u1 v1^T + 1 u2 v2^T)."""
    u = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])          # out = 3
    v = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])  # in = 4
    d = 3.0 * torch.outer(u[:, 0], v[0]) + 1.0 * torch.outer(u[:, 1], v[1])
    full = train.low_rank_state({"layers.0.mlp.up_proj.weight": d}, rank=4)
    assert full["layers.0.mlp.up_proj.lora_A"].shape == (3, 4)      # rank capped by the matrix
    torch.testing.assert_close(zoo.lora_deltas(full)["layers.0.mlp.up_proj.weight"], d)
    one = zoo.lora_deltas(train.low_rank_state({"layers.0.mlp.up_proj.weight": d}, rank=1))
    torch.testing.assert_close(one["layers.0.mlp.up_proj.weight"], 3.0 * torch.outer(u[:, 0], v[0]))


def test_adapter_is_merged_into_the_llava_checkpoint(tmp_path):
    """save_llava(lm_deltas=...) - the path `prepare` builds a zoo checkpoint with - adds each delta to exactly the
    LM weight it names (a tiny 2-layer Llama LM with SmolLM2's tokenizer; the rest of the LM is copied unchanged);
    a delta naming no weight is refused."""
    from transformers import AutoTokenizer, CLIPVisionConfig, LlamaConfig, LlamaForCausalLM, \
        LlavaForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(zoo.LMS["smollm2"].path())
    torch.manual_seed(0)
    lm = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True))
    lm.save_pretrained(tmp_path / "lm")
    tok.save_pretrained(tmp_path / "lm")
    deltas = zoo.lora_deltas(train.low_rank_state({"layers.1.mlp.up_proj.weight": torch.randn(64, 32)}, rank=2))
    vision = CLIPVisionConfig(**zoo.VISION)
    save_llava(tmp_path / "vlm", vision, zoo.LMS["smollm2"].chat_template, "<|im_end|>", seed=0,
                   lm_dir=tmp_path / "lm", tie_embeddings=True, lm_deltas=deltas)
    got = LlavaForConditionalGeneration.from_pretrained(tmp_path / "vlm").model.language_model
    torch.testing.assert_close(got.layers[1].mlp.up_proj.weight, lm.model.layers[1].mlp.up_proj.weight
                               + deltas["layers.1.mlp.up_proj.weight"])
    torch.testing.assert_close(got.layers[0].mlp.up_proj.weight, lm.model.layers[0].mlp.up_proj.weight)
    with pytest.raises(ValueError, match="name no weight"):
        save_llava(tmp_path / "bad", vision, zoo.LMS["smollm2"].chat_template, "<|im_end|>", seed=0,
                       lm_dir=tmp_path / "lm", lm_deltas={"layers.9.mlp.up_proj.weight": torch.zeros(64, 32)})


def test_answer_training_questions_and_prompts():
    """Training questions: the asked count, each on an image whose shape and colour are known (its caption is
    exact), too many refused; one prompt per question whose target is its answer ID (in the drawn format and shift)
    + the end-of-turn token."""
    from mmfragile.data.easyvqa import image_attributes, load_easy_vqa
    from mmfragile.studies.format_bias.prompts import PromptFormat

    pool = load_easy_vqa("train", n=400, seed=3)
    attrs = image_attributes("train")
    qs = train.answer_training_questions(pool, attrs, 41, seed=0)
    assert len(qs) == 41 and qs.question_id.is_unique and set(qs.question_id) <= set(pool.question_id)
    assert all({"shape", "colour"} <= set(attrs[ims[0]]) for ims in qs.images)
    assert set(qs.category) == {"yes/no", "colour", "shape"}
    known = sum({"shape", "colour"} <= set(attrs.get(ims[0], {})) for ims in pool.images)
    assert known < len(pool)  # some pictures' shape or colour no question states: those are left out
    with pytest.raises(ValueError, match="known shape and colour"):
        train.answer_training_questions(pool, attrs, known + 1, seed=0)
    prompts, targets, names = train.answer_training_prompts(qs, "<|im_end|>", seed=0, standard_share=0.25)
    for rec, p, t, f in zip(qs.to_dict("records"), prompts, targets, names):
        fmt = PromptFormat() if f == "standard" else PromptFormat.from_name(f)
        ids = fmt.ids(len(rec["options"]))
        lines = p.text.split("\n")
        answer_text = rec["options"][rec["answer"]]
        # the target ID is the one the rendered prompt puts in front of the right answer
        assert t.endswith("<|im_end|>") and fmt.render_option(t[:-len("<|im_end|>")], answer_text) in p.text
        assert t[:-len("<|im_end|>")] in ids and lines[0] == rec["question"] and p.images == rec["images"]
    assert 0 < names.count("standard") < len(names)
