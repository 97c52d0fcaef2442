"""Run-directory files: a copy of a small run killed after checkpoint 15, one file damaged, then
`train --resume` (or a fresh launch). Refused: nothing changed; finished: a complete result.

Retired (tests/faults/test_faults_rundir.py, test_faults.py carry them): config.yaml deleted with a
fresh launch, --resume, a new LR or budget; metrics.jsonl lines `}{garbage`, `[1, 2]`, no step,
NaN, the log deleted or emptied; a garbage summary.json, config_changes.json a dict;
checkpoints/events a file, .lock/metrics.jsonl/config.yaml a directory; the latest checkpoint
corrupt on resume."""
import shutil

from qa.damage import resume, to_dir, to_file, unlink, write, zero_checkpoint_data
from qa.registry import add


def _clear(d):
    for p in d.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def _metrics_line(i: int, text: str):
    def damage(d):
        p = d / "metrics.jsonl"
        lines = p.read_text().splitlines()
        lines[i] = text
        p.write_text("".join(x + "\n" for x in lines))
    return damage


def _corrupt_fallback_blocked(d):
    to_file("corrupt_checkpoints")(d)
    zero_checkpoint_data(d, "15/params")


def _truncate_meta(d):
    for p in (d / "checkpoints" / "15").rglob("_CHECKPOINT_METADATA"):
        p.write_bytes(p.read_bytes()[:5])


def _empty_latest(d):
    shutil.rmtree(d / "checkpoints" / "15")
    (d / "checkpoints" / "15").mkdir()


def _bom(d):
    (d / "config.yaml").write_bytes(b"\xef\xbb\xbf" + (d / "config.yaml").read_bytes())


ALIAS_BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "\n".join(
    f"a{i}: &a{i} [{', '.join(['*a' if i == 1 else f'*a{i - 1}'] * 9)}]" for i in range(1, 9))

# name -> (expect, damage, extra argv, fresh launch, must complete, what a refusal names)
CASES = {
    "config_and_checkpoints_deleted_fresh": (
        "error", lambda d: (unlink("config.yaml")(d), shutil.rmtree(d / "checkpoints")), (),
        True, False, None),
    "only_identity_json_fresh": (
        "ok", lambda d: (_clear(d), (d / "identity.json").write_text("{}")), (), True, False,
        None),
    "config_empty_resume": ("error", write("config.yaml", ""), (), False, False, None),
    "config_binary_resume": ("error", write("config.yaml", b"\x89PNG\x00\xff\xfe"), (), False,
                             False, "config.yaml"),
    "config_list_resume": ("error", write("config.yaml", "- 1\n- 2\n"), (), False, False, None),
    "config_no_model_resume": ("error", write("config.yaml", "preset: tiny-17k\n"), (), False,
                               False, None),
    "config_bad_key_resume": ("error", write("config.yaml",
                                             "preset: tiny-17k\nmodel: {d_model: banana}\n"),
                              (), False, False, None),
    "config_is_dir_fresh": ("error", to_dir("config.yaml"), (), True, False, None),
    "config_yaml_bom_resume": ("either", _bom, (), False, False, None),
    "config_yaml_alias_bomb_resume": ("either", write("config.yaml", ALIAS_BOMB + "\n"), (),
                                      False, False, None),
    "metrics_number_line_resume": ("error", _metrics_line(3, "42"), (), False, False, None),
    "metrics_string_step_resume": ("error", _metrics_line(3, '{"step": "four"}'), (), False,
                                   False, None),
    "metrics_binary_resume": ("error", write("metrics.jsonl", b"\xff\xfe\x00garbage\n"), (),
                              False, False, "metrics.jsonl"),
    "metrics_torn_last_line_resume": (
        "ok", lambda d: (d / "metrics.jsonl").open("a").write('{"step": 21, "lo'), (), False,
        True, None),
    "checkpoints_is_file_fresh": ("error", lambda d: (_clear(d), to_file("checkpoints")(d)), (),
                                  True, False, None),
    "checkpoint_step_is_file_resume": (
        "either", lambda d: (d / "checkpoints" / "25").write_text("x"), (), False, False, None),
    "checkpoint_dir_named_abc_resume": ("ok", lambda d: (d / "checkpoints" / "abc").mkdir(), (),
                                        False, True, None),
    "checkpoint_stray_file_resume": ("ok", write("checkpoints/notes.txt", b"x"), (), False,
                                     True, None),
    "checkpoint_metadata_truncated_resume": ("ok", _truncate_meta, (), False, True, None),
    "checkpoint_latest_empty_dir_resume": ("ok", _empty_latest, (), False, True, None),
    "all_checkpoints_corrupt_resume": ("error", zero_checkpoint_data, (), False, False, None),
    "discarded_is_file_from_step": ("error", to_file("discarded_checkpoints"),
                                    ("--from-step", "10"), False, False, None),
    "corrupt_dir_is_file_on_fallback": ("error", _corrupt_fallback_blocked, (), False, False,
                                        None),
    "events_garbage_file_resume": ("ok", write("events/garbage", b"\x00\xff" * 50), (), False,
                                   True, None),
    "config_changes_garbage_resume": ("error", write("config_changes.json", "{oops"), (), False,
                                      False, "config_changes.json"),
    "config_changes_is_dir_resume": ("either", to_dir("config_changes.json"), (), False, False,
                                     None),
    "summary_is_dir_resume": ("either", to_dir("summary.json"), (), False, False, None),
    "identity_garbage_resume": ("either", write("identity.json", b"\x00{"), (), False, False,
                                None),
    "stale_lock_file_resume": ("ok", write(".lock", "12345@nowhere\n"), (), False, True, None),
    "lock_garbage_content_resume": ("ok", write(".lock", b"\xff\xfe garbage"), (), False, True,
                                    None),
    "tokenizer_deleted_resume": ("ok", unlink("tokenizer.json"), (), False, True, None),
    "tokenizer_garbage_resume": ("error", write("tokenizer.json", "{not json"), (), False,
                                 False, "tokenizer.json"),
    "tokenizer_is_dir_resume": ("either", to_dir("tokenizer.json"), (), False, False, None),
}


def _make(damage, extra, fresh, done, text):
    def make(ctx):
        spec = resume(ctx, damage, *extra, fresh=fresh, expect_complete=done)
        if text:
            spec["expect_text"] = text
        return spec
    return make


for _name, (_expect, *_how) in CASES.items():
    add(_name, _expect, "rundir", _make(*_how))
