"""Reads every complete upgrade metrics.json under the folder given as argument (default /work/upgrade-runs) and prints the two_model reading with
standard errors (binomial SE of a top-1 at n queries, and the paired SE of new/old - old/old from the per-query hits)."""
import base64, glob, json, math, sys
import numpy as np

def unpack(text, n):
    return np.unpackbits(np.frombuffer(base64.b64decode(text), dtype=np.uint8), count=n).astype(bool)

rows = {}
for f in sorted(glob.glob((sys.argv[1] if len(sys.argv) > 1 else '/work/upgrade-runs') + '/upgrade/tinyimagenet/*/seed*/metrics.json')):
    d = json.load(open(f))
    if not d.get('complete') or 'two_model' not in d:
        continue
    rows[(d['strategy'], d['seed'])] = d

er_hits = None
print('| strategy | seed | old/old top-1 | new/old top-1 (±SE) | new/old − old/old (paired SE, z) | new/old top-5 | new/old mAP | new/new top-1 (±SE) | new/new top-5 | new/new mAP | NFR self % | NFR cross % | train s | eval s | wall s |')
print('|' + '---|' * 15)
for (s, seed), d in sorted(rows.items(), key=lambda kv: -kv[1]['two_model']['cases']['new/old']['top1']):
    t = d['two_model']; c = t['cases']; n = t['queries']
    oo = unpack(t['query_top1']['old/old'], n); no = unpack(t['query_top1']['new/old'], n)
    b = int((oo & ~no).sum()); cc = int((~oo & no).sum())
    diff = (cc - b) / n
    se_d = math.sqrt(max(b + cc - (cc - b) ** 2 / n, 0)) / n
    se = lambda p: math.sqrt(p * (1 - p) / n) * 100
    p_no = c['new/old']['top1'] / 100; p_nn = c['new/new']['top1'] / 100
    tm = d['timings']
    print(f"| {s} | {seed} | {c['old/old']['top1']:.2f} | {c['new/old']['top1']:.2f} ± {se(p_no):.2f} | "
          f"{diff*100:+.2f} ({se_d*100:.2f}, z={diff/se_d if se_d else float('nan'):.1f}) | {c['new/old']['top5']:.2f} | "
          f"{c['new/old']['mAP']:.2f} | {c['new/new']['top1']:.2f} ± {se(p_nn):.2f} | {c['new/new']['top5']:.2f} | "
          f"{c['new/new']['mAP']:.2f} | {t['negative_flips']['mean_self']*100:.2f} | {t['negative_flips']['mean_cross']*100:.2f} | "
          f"{tm['train_seconds']:.0f} | {tm['eval_seconds']:.0f} | {tm.get('wall_seconds_this_invocation', float('nan')):.0f} |")
print()
print('queries per case:', {s: d['two_model']['queries'] for (s, _), d in rows.items()})
print('old models:', {s: [m.get('path', m) if isinstance(m, dict) else m for m in d.get('replacement_models', [])] for (s, _), d in rows.items()})
print('pretrain_seconds:', {s: d['timings'].get('pretrain_seconds') for (s, _), d in rows.items()})
print('classification:', {s: d['two_model'].get('classification') for (s, _), d in rows.items()})
