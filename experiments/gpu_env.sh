# Source on the GPU machine, from the checkout's root: the image's torch/transformers + the wheels it
# lacks (.whl/, from ../shared/gpu/prepare.sh) + this checkout laid out as the installed package
# (adapters/, kernels/, recipes/ live under the domino_graft namespace: pyproject's package-dir).
SRC=$(pwd)
[ -d /tmp/site/pydantic ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$SRC"/.whl/*.whl
rm -rf /tmp/dg && mkdir -p /tmp/dg && cp -r "$SRC/domino_graft" /tmp/dg/ \
  && cp -r "$SRC/adapters" /tmp/dg/domino_graft/adapters && cp -r "$SRC/kernels" /tmp/dg/domino_graft/kernels \
  && cp -r "$SRC/recipes" /tmp/dg/domino_graft/recipes
export PYTHONPATH=/tmp/dg:/tmp/site PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
