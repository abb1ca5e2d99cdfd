"""Teacher restarts (teacher.restarts, restarts_below): the teacher of a small training set fine-tuned several times
with successive seeds, the one best on the dev set's tuning half kept, every restart's scores recorded; a large set
fine-tuned once. A rule on the training set's size, never on the task's name."""

from transformers import BertTokenizer

from distill.config import load_config, with_overrides
from distill.tasks import get_task
from distill.tasks.data import load_task_data
from distill.tasks.split import half_key
from teachers.finetune import finetune_teacher, restarts_for
from tests.conftest import SPECIAL, WORDS, tiny_job_every_stage


def test_restarts_follow_the_training_sets_size():
    config = load_config(None, {"teacher.restarts": 3, "teacher.restarts_below": 1000}).teacher
    assert restarts_for(config, 999) == 3 and restarts_for(config, 1000) == 1
    assert restarts_for(load_config(None, {"teacher.restarts": 2}).teacher, 10**6) == 2  # no size rule: always
    assert restarts_for(load_config(None).teacher, 10) == 1  # the default: once


def test_a_small_sets_teacher_is_fine_tuned_per_seed_and_the_best_on_the_tuning_half_kept(tmp_path):
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)})
    config = with_overrides(load_config(tiny_job_every_stage(tmp_path, tokenizer)),
                            {"teacher.restarts": 2, "teacher.restarts_below": 100})
    spec, data = get_task("sst2"), load_task_data(config.task)
    record = finetune_teacher(config.teacher, config.task, spec, data, tmp_path / "teacher", "id", device="cpu")
    seeds = [restart["seed"] for restart in record["restarts"]]
    assert seeds == [config.teacher.train.seed, config.teacher.train.seed + 1]
    key = half_key("tuning", "accuracy")
    best = max(record["restarts"], key=lambda restart: restart["dev"][key])
    assert record["kept"] == best["seed"] and record["dev"] == best["dev"]
    assert (tmp_path / "teacher" / "model.safetensors").is_file()  # the kept teacher, where the stage's is read
    assert not list((tmp_path / "teacher").glob("restart-*/model.safetensors"))  # the others' weights removed
    again = finetune_teacher(config.teacher, config.task, spec, data, tmp_path / "again", "id", device="cpu")
    assert [r["dev"] for r in again["restarts"]] == [r["dev"] for r in record["restarts"]]  # seeded: the same
