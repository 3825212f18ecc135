"""An RL run folder keeps the images of its step and held-out logs once, in its own `images/`."""

from tracegym.core.episode import Episode
from tracegym.testing.images import image_trace
from tracegym.train.rl_folder import RLFolder


def test_step_and_held_out_logs_share_one_image_store_and_read_back_equal(tmp_path):
    folder = RLFolder(tmp_path)
    step = [Episode.solo(image_trace(rollout_index=i)) for i in range(2)]
    held_out = [Episode.solo(image_trace((0, 0, 255)))]
    folder.write_episodes(3, step)
    folder.write_episodes(3, held_out, held_out="colour-codeword")
    assert len(list((tmp_path / "images").iterdir())) == 2
    assert ";base64," not in folder.step_log(3).traces.read_text()
    assert folder.step_log(3).read().episodes == step
    assert RLFolder(tmp_path).step_log(3, held_out="colour-codeword").read().episodes == held_out
