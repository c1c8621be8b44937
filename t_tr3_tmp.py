import time, torch, sys
torch.set_num_threads(int(sys.argv[1]))
from tests.shell.test_trainer import make_rollout, SPEC, RAW
from esper.shell.trainer import PPOConfig, PPOTrainer
from esper.shell.policy import FactoredRecurrentActorCritic
cfg = PPOConfig(hidden=64, head_hidden=32, n_epochs=4, n_minibatches=2, target_kl=None)
torch.manual_seed(0)
policy = FactoredRecurrentActorCritic(RAW + 6, SPEC, hidden=cfg.hidden, head_hidden=cfg.head_hidden)
t1 = PPOTrainer(policy, cfg, raw_obs_dim=RAW)
ro = make_rollout(policy, t1, E=4, T=25)
ts = []
for u in range(8):
    t0 = time.time(); t1.update(ro.clone()); ts.append(time.time() - t0)
print(sorted(f"{x*1e3:.0f}" for x in ts))
