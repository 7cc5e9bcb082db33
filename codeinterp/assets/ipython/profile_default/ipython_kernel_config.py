# sandboxd's code interpreter: no history database per kernel (nothing
# reads it, and every start would open one).
c.HistoryManager.enabled = False
