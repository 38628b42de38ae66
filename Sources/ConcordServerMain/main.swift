import ArgumentParser

ConcordServerCommand.main()
