"""The paper's analyses as pipeline stages, all reading one file of study traces.

``problems``     fresh problems of the synthetic task for the PRM study (studies.prm.analysis_problems)
``traces``       one sampled trace per problem with its RREDCoT credit (the input of every study)
``mc``           Monte Carlo continuations at every exit point of those traces
``figures_mc``   Figure 3 (rollouts lost to truncation) and Figure 7 (variance of MC values)
``sampling``     continuations of token-id prefixes, one random stream per sample
"""
