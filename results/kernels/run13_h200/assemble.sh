#!/bin/bash
while [ ! -f /tmp/q/ready ]; do sleep 2; done
m=/tmp/models/qwen25-coder-1.5b; mkdir -p $m; g=$m/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
cat /tmp/q/piece* > $g.tmp && mv $g.tmp $g; sha256sum $g | cut -c1-64; touch /tmp/q/assembled; echo "$(date +%T) assembled"
