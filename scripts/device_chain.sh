#!/usr/bin/env bash
# Wave 43's prepared call (~60 s on a warm Triton cache): the boundary probe (scripts/probe_chain.py: N dependent
# one-value links as kernels without PDL, with PDL, and as grid barriers in one persistent kernel, at 1 / 132 / 264
# programs), at a step's 345 links and at 40 (a shorter chain: whether the cost a link is constant).
# Usage (any H100 / H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_chain.sh
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 scripts/probe_chain.py 2>&1 | tail -8
timeout 60 python3 scripts/probe_chain.py --links 40 --programs 132 2>&1 | tail -3
echo "done ($((SECONDS-t0)) s)"
