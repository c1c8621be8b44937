import sys, torch
torch.set_num_threads(1)
from examples.cartpole_ppo import Args, train
for seed in range(int(sys.argv[1]), int(sys.argv[2])):
    for tl in (False, True):
        r = train(Args(seed=seed, frames=int(sys.argv[3]), torchrl_loss=tl), log=lambda s: None)
        c = r["curve"]
        print(seed, tl, [round(x[1]) for x in c[::4]], round(c[-1][1], 1), f"{r['wall_s']:.1f}s", flush=True)
