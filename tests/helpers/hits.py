"""Hand-made per-query top-1 hits of three models (five queries), with their negative flips worked by hand in the
flip and record tests."""
import numpy as np

T, F = True, False
H00 = np.array([T, T, T, F, F])
H10 = np.array([T, F, T, T, F])
H11 = np.array([F, F, T, T, T])
H20 = np.array([F, F, F, F, F])
H21 = np.array([F, F, F, T, F])
H22 = np.array([T, T, T, T, T])
"""Five queries, three models: hits ``[t][k]`` of queries of model t against the gallery of model k."""
