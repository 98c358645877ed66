"""Workers follow the event load.

`policy` turns observations of the stream (consumer lag, input rate, learned rate) into a
desired number of training workers. It is a pure function of observations, state and
config, so it is tested on synthetic traces without Kafka or Ray; the loop that feeds it
and applies its decisions lives beside it.
"""
